package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// ErrNoContainer is returned when a compose service has no container.
var ErrNoContainer = errors.New("no container for service")

// Compose drives the containers of one docker-compose project through the
// docker CLI, finding them by compose's labels (which both docker-compose v1
// and the compose plugin set), so it works whatever the containers are named.
type Compose struct {
	Project string
	Network string // the compose network's key in the file ("switchyard")
}

func (c Compose) docker(ctx context.Context, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// Container is the id of service's container (running or not).
func (c Compose) Container(ctx context.Context, service string) (string, error) {
	out, err := c.docker(ctx, "ps", "-aq",
		"--filter", "label=com.docker.compose.project="+c.Project,
		"--filter", "label=com.docker.compose.service="+service)
	if err != nil {
		return "", err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return "", fmt.Errorf("%w %s in project %s", ErrNoContainer, service, c.Project)
	}
	return ids[0], nil
}

func (c Compose) onService(ctx context.Context, service string, args ...string) error {
	id, err := c.Container(ctx, service)
	if err != nil {
		return err
	}
	_, err = c.docker(ctx, append(args, id)...)
	return err
}

// Kill sends SIGKILL to service's container.
func (c Compose) Kill(ctx context.Context, service string) error {
	return c.onService(ctx, service, "kill", "-s", "KILL")
}

// Start starts service's stopped container.
func (c Compose) Start(ctx context.Context, service string) error {
	return c.onService(ctx, service, "start")
}

// Stop stops service's container gracefully (SIGTERM, then SIGKILL after
// timeoutSeconds).
func (c Compose) Stop(ctx context.Context, service string, timeoutSeconds int) error {
	return c.onService(ctx, service, "stop", "-t", fmt.Sprint(timeoutSeconds))
}

// Restart stops (gracefully) and starts service's container.
func (c Compose) Restart(ctx context.Context, service string, timeoutSeconds int) error {
	return c.onService(ctx, service, "restart", "-t", fmt.Sprint(timeoutSeconds))
}

// NetworkName is the Docker name of the project's network.
func (c Compose) NetworkName(ctx context.Context) (string, error) {
	out, err := c.docker(ctx, "network", "ls", "--format", "{{.Name}}",
		"--filter", "label=com.docker.compose.project="+c.Project,
		"--filter", "label=com.docker.compose.network="+c.Network)
	if err != nil {
		return "", err
	}
	names := strings.Fields(out)
	if len(names) != 1 {
		return "", fmt.Errorf("network %s of project %s: found %q", c.Network, c.Project, names)
	}
	return names[0], nil
}

// Disconnect cuts service's container off the project network.
func (c Compose) Disconnect(ctx context.Context, service string) error {
	net, err := c.NetworkName(ctx)
	if err != nil {
		return err
	}
	return c.onService(ctx, service, "network", "disconnect", net)
}

// Connect reattaches service's container to the project network under its
// service name, which the others use to reach it.
func (c Compose) Connect(ctx context.Context, service string) error {
	net, err := c.NetworkName(ctx)
	if err != nil {
		return err
	}
	return c.onService(ctx, service, "network", "connect", "--alias", service, net)
}

// Health is the container's health status (healthy, unhealthy, starting) or
// its state when it has no health check or is not running.
func (c Compose) Health(ctx context.Context, service string) (string, error) {
	id, err := c.Container(ctx, service)
	if err != nil {
		return "", err
	}
	return c.docker(ctx, "inspect", "-f", "{{if and .State.Running .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}", id)
}

// ContainerState is what the suite reads of a container's life: its last
// exit code, how often Docker restarted it, and when it last started.
type ContainerState struct {
	ExitCode     int
	RestartCount int
	StartedAt    string
}

// State inspects service's container.
func (c Compose) State(ctx context.Context, service string) (ContainerState, error) {
	id, err := c.Container(ctx, service)
	if err != nil {
		return ContainerState{}, err
	}
	out, err := c.docker(ctx, "inspect", "-f", "{{.State.ExitCode}} {{.RestartCount}} {{.State.StartedAt}}", id)
	if err != nil {
		return ContainerState{}, err
	}
	var st ContainerState
	if _, err := fmt.Sscan(out, &st.ExitCode, &st.RestartCount, &st.StartedAt); err != nil {
		return ContainerState{}, fmt.Errorf("inspect %s: %q: %w", service, out, err)
	}
	return st, nil
}
