package app

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/switchyard/switchyard/tenant"
)

// Keys is the `switchyard keys` subcommand: helpers for the API keys file
// (docs/security.md, Tenants).
//
//	switchyard keys hash       reads a key from stdin, prints its sha256: hash
//	switchyard keys generate   prints a new random key and its hash
func Keys(_ context.Context, args []string, stdout, stderr io.Writer) error {
	return keys(args, os.Stdin, stdout, stderr)
}

func keys(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		_, _ = fmt.Fprintln(stderr, "usage: switchyard keys hash      (reads the key from stdin, prints the line for the keys file)")
		_, _ = fmt.Fprintln(stderr, "       switchyard keys generate  (prints a new random key and its hash)")
		if len(args) == 0 {
			return ErrUsage
		}
		return nil
	}
	switch args[0] {
	case "hash":
		if len(args) > 1 {
			// A key on the command line would land in the shell's history
			// and the process list.
			_, _ = fmt.Fprintln(stderr, "keys hash: pass the key on stdin, not as an argument")
			return ErrUsage
		}
		line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read key: %w", err)
		}
		key := strings.TrimRight(line, "\r\n")
		if key == "" {
			_, _ = fmt.Fprintln(stderr, "keys hash: no key on stdin")
			return ErrUsage
		}
		_, err = fmt.Fprintln(stdout, tenant.HashKey(key))
		return err
	case "generate":
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("generate key: %w", err)
		}
		key := "sy-" + base64.RawURLEncoding.EncodeToString(b[:])
		_, err := fmt.Fprintf(stdout, "key:  %s\nhash: %s\n", key, tenant.HashKey(key))
		return err
	}
	_, _ = fmt.Fprintf(stderr, "keys: unknown subcommand %q (hash, generate)\n", args[0])
	return ErrUsage
}
