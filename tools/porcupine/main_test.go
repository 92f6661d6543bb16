package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op is a compact hand-made record: process, key, f, value (input or get's output; -1 = missing), call,
// return (-1 = never returned), status.
type op struct {
	p      int
	key    string
	f      string
	v      int64
	call   int64
	ret    int64
	status string
}

func line(o op) string {
	r := map[string]interface{}{"process": o.p, "client": o.p, "key": o.key, "f": o.f, "call": o.call,
		"status": o.status, "value": nil, "output": nil, "return": nil}
	if o.ret >= 0 {
		r["return"] = o.ret
	}
	switch {
	case o.f == "get" && o.v >= 0:
		r["output"] = o.v
	case o.f != "get":
		r["value"] = o.v
	}
	b, _ := json.Marshal(r)
	return string(b)
}

func history(t *testing.T, ops []op, extra ...string) *History {
	t.Helper()
	var lines []string
	for _, o := range ops {
		lines = append(lines, line(o))
	}
	lines = append(lines, extra...)
	h, err := ReadHistory(strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func verdict(t *testing.T, model string, ops []op) Verdict {
	t.Helper()
	v, err := Check(history(t, ops), Options{Model: model, Timeout: 10 * time.Second, ShrinkTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRegisterVerdicts(t *testing.T) {
	cases := []struct {
		name string
		want string
		ops  []op
	}{
		{"sequential", "ok", []op{
			{0, "k", "get", -1, 0, 5, "ok"},
			{0, "k", "put", 1, 10, 20, "ok"},
			{1, "k", "get", 1, 30, 40, "ok"},
		}},
		{"concurrent writes, reads agree on an order", "ok", []op{
			{0, "k", "put", 1, 0, 100, "ok"},
			{1, "k", "put", 2, 10, 90, "ok"},
			{2, "k", "get", 2, 20, 30, "ok"},
			{2, "k", "get", 1, 110, 120, "ok"},
			{3, "k", "get", 1, 130, 140, "ok"},
		}},
		{"stale read after an acknowledged put", "illegal", []op{
			{0, "k", "put", 1, 0, 10, "ok"},
			{1, "k", "get", -1, 20, 30, "ok"},
		}},
		{"two readers see two orders of the same writes", "illegal", []op{
			{0, "k", "put", 1, 0, 50, "ok"},
			{1, "k", "put", 2, 0, 50, "ok"},
			{2, "k", "get", 1, 60, 70, "ok"},
			{3, "k", "get", 2, 80, 90, "ok"},
			{2, "k", "get", 1, 100, 110, "ok"},
		}},
		{"an indeterminate put may apply late", "ok", []op{
			{0, "k", "put", 1, 0, -1, "info"},
			{1, "k", "get", -1, 20, 30, "ok"},
			{1, "k", "get", 1, 500, 510, "ok"},
		}},
		{"an indeterminate put is not undone", "illegal", []op{
			{0, "k", "put", 1, 0, -1, "info"},
			{1, "k", "get", 1, 20, 30, "ok"},
			{1, "k", "get", -1, 40, 50, "ok"},
		}},
		{"a failed put never applied", "illegal", []op{
			{0, "k", "put", 1, 0, 10, "fail"},
			{1, "k", "get", 1, 20, 30, "ok"},
		}},
		{"reads that returned nothing are dropped", "ok", []op{
			{0, "k", "put", 1, 0, 10, "ok"},
			{1, "k", "get", 2, 20, 30, "info"},
			{1, "k", "get", -1, 40, 50, "fail"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if v := verdict(t, "register", c.ops); v.Verdict != c.want {
				t.Fatalf("verdict %s, want %s (%+v)", v.Verdict, c.want, v)
			}
		})
	}
}

func TestCounterVerdicts(t *testing.T) {
	cases := []struct {
		name string
		want string
		ops  []op
	}{
		{"sums", "ok", []op{
			{0, "c", "get", -1, 0, 5, "ok"},
			{0, "c", "add", 1, 10, 20, "ok"},
			{1, "c", "add", 2, 10, 20, "ok"},
			{2, "c", "get", 3, 30, 40, "ok"},
		}},
		{"a read during an add sees it or not", "ok", []op{
			{0, "c", "add", 1, 0, 10, "ok"},
			{1, "c", "add", 2, 20, 80, "ok"},
			{2, "c", "get", 1, 30, 40, "ok"},
			{3, "c", "get", 3, 50, 60, "ok"},
		}},
		{"an indeterminate add counted or not, once for all", "ok", []op{
			{0, "c", "add", 1, 0, 10, "ok"},
			{1, "c", "add", 2, 5, -1, "info"},
			{2, "c", "get", 1, 20, 30, "ok"},
			{2, "c", "get", 3, 40, 50, "ok"},
		}},
		{"an indeterminate add counted, then not", "illegal", []op{
			{0, "c", "add", 1, 0, 10, "ok"},
			{1, "c", "add", 2, 5, -1, "info"},
			{2, "c", "get", 3, 20, 30, "ok"},
			{2, "c", "get", 1, 40, 50, "ok"},
		}},
		{"a total no set of adds makes", "illegal", []op{
			{0, "c", "add", 1, 0, 10, "ok"},
			{1, "c", "add", 4, 5, -1, "info"},
			{2, "c", "get", 2, 20, 30, "ok"},
		}},
		{"a lost add", "illegal", []op{
			{0, "c", "add", 1, 0, 10, "ok"},
			{1, "c", "add", 2, 0, 10, "ok"},
			{2, "c", "get", 2, 20, 30, "ok"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if v := verdict(t, "counter", c.ops); v.Verdict != c.want {
				t.Fatalf("verdict %s, want %s (%+v)", v.Verdict, c.want, v)
			}
		})
	}
}

func TestIllegalKeyIsNamed(t *testing.T) {
	v := verdict(t, "register", []op{
		{0, "a", "put", 1, 0, 10, "ok"},
		{1, "a", "get", 1, 20, 30, "ok"},
		{0, "b", "put", 2, 0, 10, "ok"},
		{1, "b", "get", -1, 20, 30, "ok"},
	})
	if v.Verdict != "illegal" || len(v.IllegalKeys) != 1 || v.IllegalKeys[0] != "b" || v.Keys != 2 {
		t.Fatalf("%+v", v)
	}
}

// A violation buried in a long history shrinks to the ops that show it, and the witness is illegal on its
// own (it keeps the put whose value the stale reads saw).
func TestShrinkKeepsAProof(t *testing.T) {
	var ops []op
	ts := int64(0)
	for i := int64(1); i <= 60; i++ {
		ops = append(ops, op{int(i % 3), "k", "put", i, ts, ts + 10, "ok"})
		ops = append(ops, op{int(i%3) + 3, "k", "get", i, ts + 20, ts + 30, "ok"})
		ts += 40
	}
	// Put 61 is acknowledged, a later read still sees 60.
	ops = append(ops, op{0, "k", "put", 61, ts, ts + 10, "ok"})
	ops = append(ops, op{1, "k", "get", 60, ts + 20, ts + 30, "ok"})
	h := history(t, ops)
	_, byKey := ByKey(h.Ops)
	w := Shrink(RegisterModel, "register", byKey["k"], h.UniqueWrite, 10*time.Second)
	if len(w) > 3 {
		t.Fatalf("witness of %d ops, want at most 3: %v", len(w), w)
	}
	if porcupine.CheckOperations(RegisterModel, w) {
		t.Fatal("the witness is not illegal by itself")
	}
	seen := map[string]bool{}
	for _, o := range w {
		in := o.Input.(Input)
		seen[fmt.Sprintf("%s %d", in.Kind, in.Value)] = true
	}
	if !seen["put 60"] || !seen["put 61"] {
		t.Fatalf("witness lost a put it needs: %v", seen)
	}
}

func TestRunWritesVisualisationAndWitness(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "history.jsonl")
	lines := []string{
		line(op{0, "k", "put", 1, 0, 10, "ok"}),
		line(op{1, "k", "get", 1, 20, 30, "ok"}),
		line(op{2, "k", "put", 2, 40, 50, "ok"}),
		line(op{1, "k", "get", 1, 60, 70, "ok"}),
		`{"f":"nemesis","call":35,"return":45,"status":"ok","detail":"pause server 1"}`,
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	html, wit := filepath.Join(dir, "v.html"), filepath.Join(dir, "w.jsonl")
	out := captureStdout(t, func() {
		if code := run([]string{"-model", "register", "-html", html, "-witness", wit, path}); code != exitIllegal {
			t.Errorf("exit %d, want %d", code, exitIllegal)
		}
	})
	var v Verdict
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if v.Verdict != "illegal" || v.Nemesis != 1 || v.Ops["ok"] != 4 || v.WitnessKey != "k" {
		t.Fatalf("%+v", v)
	}
	if st, err := os.Stat(html); err != nil || st.Size() == 0 {
		t.Fatalf("no visualisation: %v", err)
	}
	f, err := os.Open(wit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
	}
	if n != v.WitnessOps || n == 0 || n > 3 {
		t.Fatalf("witness has %d lines, verdict says %d", n, v.WitnessOps)
	}
	// The witness is a history in its own right, and still illegal.
	if code := run([]string{"-model", "register", wit}); code != exitIllegal {
		t.Fatalf("witness: exit %d", code)
	}
}

func TestRunExitCodes(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(good, []byte(line(op{0, "k", "put", 1, 0, 10, "ok"})+"\n"), 0o644)
	os.WriteFile(bad, []byte("{\"f\":\"frob\"}\n"), 0o644)
	captureStdout(t, func() {
		if code := run([]string{good}); code != exitOk {
			t.Errorf("ok history: exit %d", code)
		}
		if code := run([]string{bad}); code != exitError {
			t.Errorf("bad history: exit %d", code)
		}
		if code := run([]string{"-model", "counter", good}); code != exitError {
			t.Errorf("a put in a counter history: exit %d", code)
		}
		if code := run([]string{filepath.Join(dir, "absent")}); code != exitError {
			t.Errorf("missing file: exit %d", code)
		}
	})
}

func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	f()
	os.Stdout = old
	w.Close()
	var b strings.Builder
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		b.WriteString(sc.Text())
	}
	return b.String()
}

// An indeterminate put nobody read is dropped before the search (it could only go last); one that was read
// stays, and the verdicts are those of the whole history.
func TestUnseenIndeterminatePutsArePruned(t *testing.T) {
	ops := []op{
		{0, "k", "put", 1, 0, 10, "ok"},
		{1, "k", "put", 2, 5, -1, "info"},
		{2, "k", "put", 3, 6, -1, "info"},
		{3, "k", "get", 2, 20, 30, "ok"},
		{3, "k", "get", 2, 40, 50, "ok"},
	}
	v := verdict(t, "register", ops)
	if v.Verdict != "ok" || v.DroppedInfo != 1 || v.Checked != 4 {
		t.Fatalf("%+v", v)
	}
	ops[4] = op{3, "k", "get", 1, 40, 50, "ok"} // put 1 came before put 2: reading it after 2 is illegal
	if v := verdict(t, "register", ops); v.Verdict != "illegal" || v.DroppedInfo != 1 {
		t.Fatalf("%+v", v)
	}
	// Under the counter model nothing is pruned: an add nobody saw alone still shows in later totals.
	cops := []op{{0, "c", "add", 1, 0, 10, "ok"}, {1, "c", "add", 2, 5, -1, "info"}, {2, "c", "get", 3, 20, 30, "ok"}}
	if v := verdict(t, "counter", cops); v.Verdict != "ok" || v.DroppedInfo != 0 {
		t.Fatalf("%+v", v)
	}
}

// Counter: a read that missed an acknowledged add, early in a long history. The witness drops every read
// but the bad one and every add called after it returned, and the adds before it (each returned before the
// next op was called) become one add of their sum.
func TestShrinkCounter(t *testing.T) {
	var ops []op
	ts, total := int64(0), int64(0)
	for i := 0; i < 100; i++ {
		ops = append(ops, op{0, "c", "add", 1, ts, ts + 10, "ok"})
		total++
		got := total
		if i == 5 {
			got = total - 1 // the add just acknowledged is missing
		}
		ops = append(ops, op{1, "c", "get", got, ts + 20, ts + 30, "ok"})
		ts += 40
	}
	h := history(t, ops)
	_, byKey := ByKey(h.Ops)
	w := Shrink(CounterModel, "counter", byKey["c"], h.UniqueWrite, 10*time.Second)
	if porcupine.CheckOperations(CounterModel, w) {
		t.Fatal("the witness is not illegal by itself")
	}
	if len(w) != 2 {
		t.Fatalf("witness of %d ops, want the sum of the 6 adds and the bad read", len(w))
	}
	first := w[0].Input.(Input)
	if first.Kind != "add" || first.Value != 6 || w[0].Metadata.(Meta).Rec.Detail == "" {
		t.Fatalf("first op of the witness: %+v %+v", first, w[0].Metadata.(Meta).Rec)
	}
}
