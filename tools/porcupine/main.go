// Command porcupine checks a ramgrid client history for linearizability, one key at a time, with Porcupine
// (github.com/anishathalye/porcupine), as etcd's robustness tests and Jepsen's Knossos do.
//
// Usage:
//
//	porcupine -model register|counter [-timeout 60s] [-html FILE] [-witness FILE] HISTORY.jsonl
//
// It prints one line of JSON (the verdict) and exits 0 when the history is linearizable, 1 when it is not,
// 2 on an error (a bad file, a bad flag) and 3 when the checker ran out of time (unknown). The history
// format, the models and how to read the output: docs/jepsen.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"
)

const (
	exitOk      = 0
	exitIllegal = 1
	exitError   = 2
	exitUnknown = 3
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("porcupine", flag.ContinueOnError)
	model := fs.String("model", "register", "register (put/get) or counter (add/get)")
	timeout := fs.Duration("timeout", 60*time.Second, "time for the check, and as much again to name the illegal keys; past it: unknown (0: no limit)")
	shrink := fs.Duration("shrink-timeout", 30*time.Second, "time for shrinking a violation to a witness")
	html := fs.String("html", "", "write Porcupine's visualisation of a violation here")
	witness := fs.String("witness", "", "write the shrunk ops of the first illegal key here (JSON lines)")
	if err := fs.Parse(args); err != nil {
		return exitError
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: porcupine [flags] HISTORY.jsonl")
		fs.PrintDefaults()
		return exitError
	}
	fail := func(err error) int {
		b, _ := json.Marshal(map[string]string{"verdict": "error", "error": err.Error()})
		fmt.Println(string(b))
		return exitError
	}
	h, err := ReadHistoryFile(fs.Arg(0))
	if err != nil {
		return fail(err)
	}
	v, err := Check(h, Options{Model: *model, Timeout: *timeout, ShrinkTimeout: *shrink, HTML: *html, Witness: *witness})
	if err != nil {
		return fail(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fail(err)
	}
	fmt.Println(string(b))
	switch v.Verdict {
	case "ok":
		return exitOk
	case "illegal":
		return exitIllegal
	}
	return exitUnknown
}
