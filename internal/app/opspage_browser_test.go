package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/tenant"
)

// browser starts a headless chromium for chromedp, or skips the test when
// none is installed. Screenshots go to $SWITCHYARD_SCREENSHOTS (kept) or a
// test temporary directory (logged).
func browser(t *testing.T) (context.Context, string) {
	t.Helper()
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no chromium on PATH: the operators' page browser test needs Debian's chromium package (.ci/run installs it)")
	}
	dir := os.Getenv("SWITCHYARD_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Logf("screenshots in %s", dir)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1920, 1080), chromedp.Flag("hide-scrollbars", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return ctx, dir
}

// waitOnPage polls the page until expr (a JavaScript boolean expression over
// the document) holds, failing with what the page shows otherwise.
func waitOnPage(t *testing.T, ctx context.Context, what, expr string, within time.Duration) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := chromedp.Do(pctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(200*time.Millisecond),
		chromedp.WithPollingTimeout(within))); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Text("main"))
		t.Fatalf("the page never showed %s (%v); it reads:\n%s", what, err, text)
	}
}

func screenshot(t *testing.T, ctx context.Context, dir, name string, width, height int64) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(width, height)))
	before, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.polls || "0"`))
	require.NoError(t, err)
	// One poll rendered at the new size (the page counts its polls).
	waitOnPage(t, ctx, "a poll after resizing", fmt.Sprintf(`(document.body.dataset.polls || "0") !== %q`, before), 10*time.Second)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100 is PNG, below it JPEG
	require.NoError(t, err)
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot %s", path)
}

// rowText is a JavaScript expression: the text of the table row whose
// data attribute attr is id ("" when there is none).
func rowText(attr, id string) string {
	return fmt.Sprintf(`((document.querySelector('tr[data-%s="%s"]')||{}).innerText||"")`, attr, id)
}

// chooseDecisions picks an option of the decisions' filter ("" for all) as
// a person would: the select's value, then its change event.
func chooseDecisions(value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const s = document.querySelector('#decision-filter'); s.value = %q; s.dispatchEvent(new Event('change')); })()`, value))
}

func TestTheOperatorsPageShowsTheTierAReplicaLeavingAndAnEngineDying(t *testing.T) {
	ctx, dir := browser(t)
	c := newTestCluster(t, 2)
	engine := startVLLMEngine(t, c, "v1", nil, func(a *adapter.Config) {
		a.HealthFailures = 100000 // the adapter stays registered after its engine dies
	})
	rs := []*runningReplica{c.startReplica("r1"), c.startReplica("r2"), c.startReplica("r3")}
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")

	// A few requests through every replica, so decisions and rates show.
	for i, r := range rs {
		cl := r.client()
		for j, class := range defaultClasses {
			_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat(fmt.Sprintf("turn %d of the page test ", j), 30))},
				MaxTokens: openai.Int(2),
			}, option.WithHeader("x-switchyard-class", class))
			require.NoError(t, err, "replica %d class %s", i, class)
		}
	}

	// The same prompt pinned first to w1, then to w2: the second decision
	// could have reached w1's cached prefix and the pin forbade it.
	pinned := strings.Repeat("a conversation pinned to one worker ", 20)
	for _, w := range []string{"w1", "w2"} {
		cl := rs[0].client()
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(pinned)},
			MaxTokens: openai.Int(2),
		}, option.WithHeader("x-switchyard-worker", w))
		require.NoError(t, err, "pinned to %s", w)
	}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+rs[0].status.HTTPAddr+"/")))
	waitOnPage(t, ctx, "three ready replicas",
		`document.querySelectorAll('#replicas tbody tr').length === 3 && [...document.querySelectorAll('#replicas tbody tr')].every(r => r.innerText.includes('ready'))`, 20*time.Second)
	for _, id := range []string{"w1", "w2", "v1"} {
		waitOnPage(t, ctx, id+" healthy", rowText("worker", id)+`.includes('healthy') && !`+rowText("worker", id)+`.includes('unhealthy')`, 20*time.Second)
	}
	waitOnPage(t, ctx, "the routing decisions", `document.querySelectorAll('#decisions tbody tr td').length > 1`, 10*time.Second)
	waitOnPage(t, ctx, "the pinned decision's shortfall", `document.querySelector('#decisions tbody').innerText.includes('pinned') && document.querySelector('#quality .reasons').innerText.includes('pinned')`, 10*time.Second)
	// The pinned decision weighed w2 (the winner) and w1 (the holder of the
	// prefix), each with its cached tokens and predicted TTFT, and shows
	// the TTFT it got.
	pinnedRow := `[...document.querySelectorAll('#decisions tbody tr')].find(r => r.innerText.includes('pinned'))`
	waitOnPage(t, ctx, "the pinned decision's two candidates with predicted TTFTs",
		`(() => { const r = `+pinnedRow+`; if (!r) return false; const c = [...r.querySelectorAll('td.cands .chip')];
		  return c.length >= 2 && c[0].innerText.startsWith('w2') && c[0].classList.contains('win') && c[1].innerText.startsWith('w1')
		    && c.every(x => / · [0-9.,]+ ms$/.test(x.innerText)) && /· [0-9.,]+ ms · [0-9.,]+ ms$/.test(r.lastElementChild.innerText); })()`, 10*time.Second)
	// The workers served requests: the owners calibrated them and the
	// engines reported cached tokens to compare with the predictions.
	// w1 and w2 each served a pinned request (v1 may have served none).
	waitOnPage(t, ctx, "w1's and w2's calibration, and predicted against reported cached tokens",
		`['w1', 'w2'].map(id => document.querySelector('tr[data-worker="' + id + '"]')).every(r => r && /r[123] ×[0-9.]+ \+[0-9.]+ ms/.test(r.querySelector('td.calibration').innerText)
		   && /^[0-9,]+ \/ [0-9,]+/.test(r.querySelector('td.cached').innerText))`, 10*time.Second)
	waitOnPage(t, ctx, "each class's queue, by tier (no tiers when idle)", `[...document.querySelectorAll('#classes td.tiers')].filter(td => td.innerText.trim() === '0').length === `+fmt.Sprint(len(defaultClasses)), 10*time.Second)
	waitOnPage(t, ctx, "an open API's tenants panel", `document.querySelector('#tenants tbody').innerText.includes('no tenants')`, 10*time.Second)
	screenshot(t, ctx, dir, "opspage-1-tier-1080p.png", 1920, 1080)
	screenshot(t, ctx, dir, "opspage-1-tier-laptop.png", 1366, 768)

	// The decisions of one class only.
	class := defaultClasses[0]
	require.NoError(t, chromedp.Do(ctx, chooseDecisions("class:"+class)))
	waitOnPage(t, ctx, "only "+class+"'s decisions",
		`(() => { const rs = [...document.querySelectorAll('#decisions tbody tr[data-decision]')]; return rs.length > 0 && rs.every(r => r.children[2].innerText.startsWith('`+class+` ')); })()`, 10*time.Second)
	require.NoError(t, chromedp.Do(ctx, chooseDecisions("")))

	// r3 leaves: its classes show a new owner, and the replica list shrinks.
	var moved []string
	for _, class := range defaultClasses {
		if rs[2].status.Owners()[class].Replica == "r3" {
			moved = append(moved, class)
		}
	}
	require.NotEmpty(t, moved, "rendezvous placement gives r3 at least one class of %v", defaultClasses)
	rs[2].stop(t)
	c.mu.Lock()
	delete(c.replicas, "r3")
	c.mu.Unlock()
	for _, class := range moved {
		owner := fmt.Sprintf(`((document.querySelector('tr[data-class="%s"] td.owner')||{}).innerText||"")`, class)
		waitOnPage(t, ctx, "class "+class+" owned by a survivor", `/^r[12] /.test(`+owner+`)`, 20*time.Second)
	}
	waitOnPage(t, ctx, "two replicas", `document.querySelectorAll('#replicas tbody tr').length === 2`, 20*time.Second)

	// v1's engine dies; the adapter stays registered but stops reporting load.
	require.NoError(t, engine.worker.stop())
	waitOnPage(t, ctx, "v1 unhealthy", rowText("worker", "v1")+`.includes('unhealthy')`, 20*time.Second)
	waitOnPage(t, ctx, "w1 still healthy", `!`+rowText("worker", "w1")+`.includes('unhealthy')`, time.Second)
	screenshot(t, ctx, dir, "opspage-2-after-1080p.png", 1920, 1080)
}

func TestWithAKeysFileThePageAsksForTheAdminKeyBeforeShowingTheTier(t *testing.T) {
	ctx, dir := browser(t)
	keys := writeKeys(t, fmt.Sprintf("tenants:\n  - id: acme\n    keys: [%q]\n    quota: {concurrent: 4, requests_per_minute: 6, tokens_per_minute: 60000}\n"+
		"  - id: idle\n    keys: [%q]\n    quota: {concurrent: 2}\nadmins:\n  - id: ops\n    keys: [%q]\n",
		tenant.HashKey("sk-acme"), tenant.HashKey("sk-idle"), tenant.HashKey("sk-admin")))
	c := newTestCluster(t, 1)
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys })
	c.waitPlaced(defaultClasses, "r1")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+r.status.HTTPAddr+"/")))
	waitOnPage(t, ctx, "the admin key prompt", `!document.querySelector('#auth').hidden && document.querySelector('#auth-why').innerText.includes('admin key')`, 20*time.Second)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#replicas tbody tr').length`))
	require.NoError(t, err)
	require.Zero(t, rows, "the page showed the tier before any key was given")

	// A tenant's key does not open it: the prompt says so.
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys("#auth-key", "sk-acme"), chromedp.Click("#auth button")))
	waitOnPage(t, ctx, "the prompt refusing a tenant's key", `!document.querySelector('#auth').hidden && document.querySelector('#auth-why').innerText.includes("tenant's")`, 20*time.Second)

	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys("#auth-key", "sk-admin"), chromedp.Click("#auth button")))
	waitOnPage(t, ctx, "the tier after the admin key", `document.querySelector('#auth').hidden && `+rowText("replica", "r1")+`.includes('ready')`, 20*time.Second)

	// Two requests of acme's: r1 owns every class, so its scheduler holds
	// acme's buckets (6 requests a minute refill one in ten seconds).
	acme := keyedClient(r, "sk-acme")
	for i := range 2 {
		_, err := acme.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("acme asks question %d", i))},
			MaxTokens: openai.Int(2),
		})
		require.NoError(t, err)
	}
	waitOnPage(t, ctx, "acme against its quota",
		`(() => { const r = document.querySelector('tr[data-tenant="acme"]'); if (!r) return false; const t = r.innerText;
		  return t.includes('4 concurrent') && t.includes('6 rpm') && t.includes('60,000 tpm') && /r1 0 \/ 4/.test(r.querySelector('td.inflight').innerText)
		    && /r1 [0-9.]+ of 6/.test(r.children[3].innerText); })()`, 20*time.Second)
	waitOnPage(t, ctx, "the idle tenant", rowText("tenant", "idle")+`.includes('2 concurrent') && `+rowText("tenant", "idle")+`.includes('idle')`, time.Second)
	screenshot(t, ctx, dir, "opspage-4-tenants.png", 1366, 768)
	screenshot(t, ctx, dir, "opspage-3-after-admin-key.png", 1366, 768)
}

// One worker with one slot, held by a long stream: the requests that come
// next queue at the class owner, and the page shows them by priority tier.
func TestThePageShowsAClassQueueByPriorityTier(t *testing.T) {
	ctx, dir := browser(t)
	c := newTestCluster(t, 0)
	cfg := testWorkerConfig()
	cfg.EtcdEndpoints, cfg.NATSURL = c.etcd.Endpoints, c.nats.URL
	cfg.Engine.MaxNumSeqs = 1 // one request at a time
	cfg.Engine.Speedup = 1    // slow enough to hold a long stream
	c.workers = append(c.workers, startWorker(t, cfg))
	r := c.startReplica("r1")
	c.waitOwned(defaultClasses, "r1")
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, err := r.status.SchedulableWorkers(testenv.Context(t))
		return err == nil && n == 1
	}, "the worker schedulable")

	hold, release := context.WithCancel(testenv.Context(t))
	var wg sync.WaitGroup
	defer wg.Wait() // after release: every request ends with its context
	defer release()
	send := func(priority, maxTokens int, stream bool) (*http.Response, error) {
		body := fmt.Sprintf(`{"model":%q,"prompt":"queued at priority %d","max_tokens":%d,"stream":%t}`, testModel, priority, maxTokens, stream)
		req, err := http.NewRequestWithContext(hold, http.MethodPost, "http://"+r.status.HTTPAddr+"/v1/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Switchyard-Class", "batch")
		req.Header.Set("X-Switchyard-Priority", fmt.Sprint(priority))
		return http.DefaultClient.Do(req)
	}
	long, err := send(0, 4000, true)
	require.NoError(t, err)
	defer long.Body.Close()
	_, err = bufio.NewReader(long.Body).ReadString('\n') // the worker's one slot is taken
	require.NoError(t, err)
	for _, p := range []int{2, 2, 0} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := send(p, 1, false); err == nil { // cancelled at the end: an error is the normal outcome
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+r.status.HTTPAddr+"/")))
	waitOnPage(t, ctx, "batch's queue of 3: two at priority 2, one at 0",
		`(() => { const td = document.querySelector('tr[data-class="batch"] td.tiers'); if (!td) return false;
		  const chips = [...td.querySelectorAll('.chip')].map(c => c.innerText);
		  return td.innerText.trim().startsWith('3') && chips.length === 2 && chips[0] === 'p2 2' && chips[1] === 'p0 1'; })()`, 20*time.Second)
	screenshot(t, ctx, dir, "opspage-5-queue-by-tier.png", 1366, 768)
}

// A worker whose KV events never reach the index wears a badge on its row,
// with the replica that judged it and why; the worker whose events flow
// does not. Each row shows its engine's prefix-cache hit rate.
func TestThePageBadgesAWorkerWhoseKVEventsAreSilent(t *testing.T) {
	ctx, _ := browser(t)
	r := startSilentPair(t)
	_, n := serveUntilSilent(t, r)
	// The judgement holds only while the workers keep computing blocks.
	sctx, stop := context.WithCancel(testenv.Context(t))
	var serving sync.WaitGroup
	serving.Go(func() {
		for i := n + 1; sctx.Err() == nil; i++ {
			for _, w := range []string{"v1", "v2"} {
				_ = servePinned(sctx, r, w, i) // ends with sctx; the page shows whether it worked
			}
		}
	})
	t.Cleanup(func() { stop(); serving.Wait() })
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+r.status.HTTPAddr+"/")))
	waitOnPage(t, ctx, "v2's silent badge with why",
		rowText("worker", "v2")+`.includes('KV events silent') && `+rowText("worker", "v2")+`.includes('r1: since') && `+rowText("worker", "v2")+`.includes('prompt blocks')`, 20*time.Second)
	waitOnPage(t, ctx, "v1 without the badge and both hit rates",
		`!`+rowText("worker", "v1")+`.includes('KV events silent') && ['v1', 'v2'].every(id => /%$/.test((document.querySelector('tr[data-worker="' + id + '"] td.hits')||{}).innerText||""))`, 10*time.Second)
}

// `up -protocol vllm -dp-size 2` with two engines: the workers table shows
// each engine as one row (its URL and rank count) with its two ranks
// beneath it, each a routing target with its rank and its own health.
func TestThePageShowsADataParallelEngineAsOneRowWithItsRanksBeneath(t *testing.T) {
	ctx, dir := browser(t)
	cfg := upTestConfig(t, 1, 2)
	cfg.Protocol = ProtocolVLLM
	cfg.DPSize = 2
	ports := freePortRun(t, 12) // 2 engines × 2 ranks × (event, replay), then 4 adapters
	cfg.ZMQPort, cfg.AdapterPort = ports, ports+8
	up := startUpRun(t, cfg)
	defer up.stop(t)
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	var addr string
	for up.lines.Scan() && !strings.HasPrefix(up.lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
	}
	up.drain()
	require.NotEmpty(t, addr)
	awaitDebugCluster(t, addr, func(d clusterDoc) bool { return len(d.Workers) == 4 }, "four ranks registered")

	// A request to each rank, pinned as an operator would, so rows have load.
	cl := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1"), option.WithAPIKey("none"))
	for _, w := range []string{"worker-1-dp0", "worker-1-dp1", "worker-2-dp0", "worker-2-dp1"} {
		var hr *http.Response
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(cfg.Worker.Model),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a request for one rank ", 20))},
			MaxTokens: openai.Int(2),
		}, option.WithHeader("x-switchyard-worker", w), option.WithResponseInto(&hr))
		require.NoError(t, err, "pinned to %s", w)
		require.Equal(t, w, hr.Header.Get("X-Switchyard-Routed-Worker"))
	}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://"+addr+"/")))
	want := []string{"engine worker-1", "rank worker-1-dp0", "rank worker-1-dp1", "engine worker-2", "rank worker-2-dp0", "rank worker-2-dp1"}
	order := `[...document.querySelectorAll('#workers tbody tr')].map(r => r.classList.contains('dp-engine') ? 'engine ' + r.dataset.engine
	  : r.classList.contains('dp-rank') ? 'rank ' + r.dataset.worker : 'other ' + (r.dataset.worker || '')).join(',')`
	waitOnPage(t, ctx, "two engine rows, each with its two ranks beneath in rank order", order+` === `+fmt.Sprintf("%q", strings.Join(want, ",")), 20*time.Second)
	for i := 1; i <= 2; i++ {
		e := fmt.Sprintf("worker-%d", i)
		waitOnPage(t, ctx, e+"'s row: its URL and two ranks",
			fmt.Sprintf(`/worker-%d 127\.0\.0\.1:[0-9]+ · 2 data-parallel ranks/.test(`, i)+rowText("engine", e)+`)`, time.Second)
		for r := range 2 {
			id := fmt.Sprintf("%s-dp%d", e, r)
			waitOnPage(t, ctx, id+" healthy under "+e+" as rank "+fmt.Sprint(r),
				fmt.Sprintf(`(() => { const tr = document.querySelector('tr[data-worker="%s"]'); return tr && tr.dataset.engine === '%s'
				  && tr.children[0].innerText === '%s rank %d' && tr.querySelector('td.health').innerText.trim() === 'healthy'; })()`, id, e, id, r), 20*time.Second)
		}
	}
	screenshot(t, ctx, dir, "opspage-6-data-parallel.png", 1366, 768)
}
