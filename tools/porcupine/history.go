package main

// The history file: one JSON object a line, written by python/ramgrid/testing/jepsen.py (docs/jepsen.md).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Record is one line of a history: a client operation (f = put, get, add) or a nemesis event (f = nemesis).
//
// Value is the input (the value a put wrote, the delta an add merged; absent for a get). Output is what a
// successful get returned: a number, or null for a missing key. Call and Return are CLOCK_MONOTONIC
// nanoseconds; Return is null for an op that never returned. Status is ok (returned; its effect happened),
// fail (definitely not applied) or info (indeterminate: it may or may not have taken effect).
type Record struct {
	Process int             `json:"process"`
	Client  int             `json:"client"`
	Key     string          `json:"key"`
	F       string          `json:"f"`
	Value   *int64          `json:"value"`
	Output  *int64          `json:"output"`
	Call    int64           `json:"call"`
	Return  *int64          `json:"return"`
	Status  string          `json:"status"`
	Error   string          `json:"error,omitempty"`
	Detail  string          `json:"detail,omitempty"`
	Line    int             `json:"-"`
	Raw     json.RawMessage `json:"-"`
}

// Input of an operation, as the models see it.
type Input struct {
	Kind  string // "put", "get" or "add"
	Key   string
	Value int64
}

// Output of an operation. Known is false for an indeterminate write, whose result nobody saw.
type Output struct {
	Known bool
	Found bool
	Value int64
}

// Meta travels with each operation, for the visualisation and for writing the witness back out.
type Meta struct {
	Rec *Record
}

// History is a parsed file: the operations to check, what was dropped, and the nemesis events.
type History struct {
	Ops         []porcupine.Operation
	Nemesis     []*Record
	Counts      map[string]int // records per status (client operations only)
	DroppedFail int            // failed ops: definitely not applied, so left out
	DroppedRead int            // reads that did not return a value (fail or info): reads change nothing
	DroppedInfo int            // indeterminate puts no read saw (PruneUnseenPuts)
	End         int64          // "infinity": later than every timestamp of the history
	UniqueWrite bool           // every put wrote a value no other put of its key wrote
}

// ReadHistory parses a history. A line that is not a valid record is an error naming the line.
func ReadHistory(r io.Reader) (*History, error) {
	var recs []*Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		rec := &Record{Line: n, Raw: json.RawMessage(append([]byte(nil), line...))}
		if err := json.Unmarshal([]byte(line), rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if err := validate(rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return build(recs), nil
}

// ReadHistoryFile reads the history at path.
func ReadHistoryFile(path string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadHistory(f)
}

func validate(r *Record) error {
	switch r.F {
	case "nemesis":
		return nil
	case "put", "add":
		if r.Value == nil {
			return fmt.Errorf("%s without a value", r.F)
		}
	case "get":
	default:
		return fmt.Errorf("unknown op %q", r.F)
	}
	switch r.Status {
	case "ok":
		if r.Return == nil {
			return fmt.Errorf("an ok op needs a return time")
		}
		if *r.Return < r.Call {
			return fmt.Errorf("returned (%d) before it was called (%d)", *r.Return, r.Call)
		}
	case "fail", "info":
	default:
		return fmt.Errorf("unknown status %q", r.Status)
	}
	return nil
}

// build turns records into Porcupine operations. Failed ops are dropped (they did not happen). An
// indeterminate (info) write gets End as its return time, as Jepsen and Porcupine do: it may take effect at
// any point after its call, or (placed after every other op) never, which a checker cannot tell apart from
// not happening. A read that returned nothing usable is dropped: a read changes no state.
func build(recs []*Record) *History {
	h := &History{Counts: map[string]int{"ok": 0, "fail": 0, "info": 0}, UniqueWrite: true}
	for _, r := range recs {
		if r.Call >= h.End {
			h.End = r.Call + 1
		}
		if r.Return != nil && *r.Return >= h.End {
			h.End = *r.Return + 1
		}
	}
	// Dense client ids for the visualisation (one row per process, in process order).
	procs := map[int]int{}
	var ids []int
	for _, r := range recs {
		if r.F != "nemesis" {
			if _, seen := procs[r.Process]; !seen {
				procs[r.Process] = 0
				ids = append(ids, r.Process)
			}
		}
	}
	sort.Ints(ids)
	for i, p := range ids {
		procs[p] = i
	}
	written := map[string]map[int64]bool{}
	for _, r := range recs {
		if r.F == "nemesis" {
			h.Nemesis = append(h.Nemesis, r)
			continue
		}
		h.Counts[r.Status]++
		if r.Status == "fail" {
			h.DroppedFail++
			continue
		}
		in := Input{Kind: r.F, Key: r.Key}
		if r.Value != nil {
			in.Value = *r.Value
		}
		if r.F == "put" {
			if written[r.Key] == nil {
				written[r.Key] = map[int64]bool{}
			}
			if written[r.Key][in.Value] {
				h.UniqueWrite = false
			}
			written[r.Key][in.Value] = true
		}
		var out Output
		ret := h.End
		if r.Status == "ok" {
			ret = *r.Return
			out.Known = true
			if r.Output != nil {
				out.Found = true
				out.Value = *r.Output
			}
		} else if r.F == "get" {
			h.DroppedRead++
			continue
		}
		h.Ops = append(h.Ops, porcupine.Operation{
			ClientId: procs[r.Process],
			Input:    in,
			Call:     r.Call,
			Output:   out,
			Return:   ret,
			Metadata: Meta{Rec: r},
		})
	}
	return h
}

// ByKey groups operations by key, keys in sorted order.
func ByKey(ops []porcupine.Operation) ([]string, map[string][]porcupine.Operation) {
	m := map[string][]porcupine.Operation{}
	for _, op := range ops {
		k := op.Input.(Input).Key
		m[k] = append(m[k], op)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, m
}

// WriteRecords writes the original lines of ops' records, in call order.
func WriteRecords(path string, ops []porcupine.Operation) error {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var b strings.Builder
	for _, op := range sorted {
		b.Write(op.Metadata.(Meta).Rec.Raw)
		b.WriteByte('\n')
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// PruneUnseenPuts drops the indeterminate puts whose value no read returned, when every put of a key wrote a
// value of its own (the register model). This changes no verdict: such a put may be placed after every other
// operation (its return is the end of the history), where it explains nothing and contradicts nothing, so a
// history is linearizable with it exactly when it is without it. It matters for the cost: every indeterminate
// op stays open to the end, and a fault makes hundreds of them (each write fails until the fail-over), most of
// them never read; Porcupine's search grows with the ops open at once.
func (h *History) PruneUnseenPuts() {
	if !h.UniqueWrite {
		return
	}
	type kv struct {
		key string
		v   int64
	}
	seen := map[kv]bool{}
	for _, op := range h.Ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind == "get" && out.Found {
			seen[kv{in.Key, out.Value}] = true
		}
	}
	kept := h.Ops[:0]
	for _, op := range h.Ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind == "put" && !out.Known && !seen[kv{in.Key, in.Value}] {
			h.DroppedInfo++
			continue
		}
		kept = append(kept, op)
	}
	h.Ops = kept
}
