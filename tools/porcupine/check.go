package main

// Checking a history and shrinking a violation to a small witness.

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is the one-line JSON the program prints.
type Verdict struct {
	Verdict       string         `json:"verdict"` // ok, illegal or unknown (the checker timed out)
	Model         string         `json:"model"`
	Ops           map[string]int `json:"ops"` // client records per status, before anything is dropped
	Checked       int            `json:"checked_ops"`
	DroppedFail   int            `json:"dropped_failed"`
	DroppedReads  int            `json:"dropped_reads"`
	DroppedInfo   int            `json:"dropped_unseen_info"`
	Keys          int            `json:"keys"`
	IllegalKeys   []string       `json:"illegal_keys"`
	UnknownKeys   []string       `json:"unknown_keys"`
	Nemesis       int            `json:"nemesis_events"`
	Visualization string         `json:"visualization,omitempty"`
	Witness       string         `json:"witness,omitempty"`
	WitnessKey    string         `json:"witness_key,omitempty"`
	WitnessOps    int            `json:"witness_ops,omitempty"`
	WitnessFrom   int            `json:"witness_from,omitempty"` // the illegal key's ops before shrinking
	ElapsedMs     int64          `json:"elapsed_ms"`
}

// Options of one check.
type Options struct {
	Model         string
	Timeout       time.Duration // the whole-history check
	ShrinkTimeout time.Duration // the shrinking, all tries together
	HTML          string        // where to write the visualisation of a violation ("" = nowhere)
	Witness       string        // where to write the shrunk witness ("" = nowhere)
}

// Check judges h under opts.Model and writes the visualisation and the witness of a violation.
func Check(h *History, opts Options) (Verdict, error) {
	start := time.Now()
	model, write, err := ModelNamed(opts.Model)
	if err != nil {
		return Verdict{}, err
	}
	for _, op := range h.Ops {
		in := op.Input.(Input)
		if in.Kind != "get" && in.Kind != write {
			r := op.Metadata.(Meta).Rec
			return Verdict{}, fmt.Errorf("line %d: a %s in a %s history", r.Line, in.Kind, opts.Model)
		}
	}
	if opts.Model == "register" {
		h.PruneUnseenPuts()
	}
	keys, byKey := ByKey(h.Ops)
	v := Verdict{
		Model:        opts.Model,
		Ops:          h.Counts,
		Checked:      len(h.Ops),
		DroppedFail:  h.DroppedFail,
		DroppedReads: h.DroppedRead,
		DroppedInfo:  h.DroppedInfo,
		Keys:         len(keys),
		IllegalKeys:  []string{},
		UnknownKeys:  []string{},
		Nemesis:      len(h.Nemesis),
	}
	res, info := porcupine.CheckOperationsVerbose(model, h.Ops, opts.Timeout)
	switch res {
	case porcupine.Ok:
		v.Verdict = "ok"
	case porcupine.Illegal:
		v.Verdict = "illegal"
	default:
		v.Verdict = "unknown"
	}
	if res != porcupine.Ok {
		// The partitioned check answers for the whole history; which keys are illegal is asked key by key,
		// all of them within one more timeout (a key not reached in time is unknown).
		deadline := time.Now().Add(opts.Timeout)
		for _, k := range keys {
			res := porcupine.Unknown
			if opts.Timeout <= 0 {
				res = porcupine.CheckOperationsTimeout(model, byKey[k], 0) // no limit, as for the whole
			} else if left := time.Until(deadline); left > 0 {
				res = porcupine.CheckOperationsTimeout(model, byKey[k], left)
			}
			switch res {
			case porcupine.Illegal:
				v.IllegalKeys = append(v.IllegalKeys, k)
			case porcupine.Unknown:
				v.UnknownKeys = append(v.UnknownKeys, k)
			}
		}
	}
	if res == porcupine.Illegal {
		if opts.HTML != "" {
			info.AddAnnotations(nemesisAnnotations(h))
			if err := porcupine.VisualizePath(model, info, opts.HTML); err != nil {
				return v, fmt.Errorf("writing the visualisation: %v", err)
			}
			v.Visualization = opts.HTML
		}
		if opts.Witness != "" && len(v.IllegalKeys) > 0 {
			k := v.IllegalKeys[0]
			w := Shrink(model, opts.Model, byKey[k], h.UniqueWrite, opts.ShrinkTimeout)
			if err := WriteRecords(opts.Witness, w); err != nil {
				return v, fmt.Errorf("writing the witness: %v", err)
			}
			v.Witness, v.WitnessKey, v.WitnessOps, v.WitnessFrom = opts.Witness, k, len(w), len(byKey[k])
		}
	}
	v.ElapsedMs = time.Since(start).Milliseconds()
	return v, nil
}

func nemesisAnnotations(h *History) []porcupine.Annotation {
	var out []porcupine.Annotation
	for _, r := range h.Nemesis {
		end := r.Call
		if r.Return != nil {
			end = *r.Return
		}
		out = append(out, porcupine.Annotation{
			Tag:             "nemesis",
			Start:           r.Call,
			End:             end,
			Description:     r.Detail,
			Details:         fmt.Sprintf("line %d: %s", r.Line, r.Detail),
			BackgroundColor: "#f4cccc",
		})
	}
	return out
}

// Shrink returns a small sub-history of ops (one key's, known illegal) that is still illegal.
//
// Only sub-histories that are illegal whenever ops is illegal are tried, so the witness proves the
// violation by itself: dropping ops at will would soon leave a read of a value whose write was dropped,
// illegal for a reason the system never had. Take any linearization of the bigger history:
//
//   - a read changes no state, so without it the rest is still explained: reads may always go;
//   - register model, every put of the key writing its own value: a put no remaining read returned may go
//     (the reads that followed it in the order read a later put);
//   - counter model: an add called after every remaining read had returned may go (real time puts it after
//     all of them); any other add stays, since every total after it counts it.
//
// Any other model or history drops reads only. A counter history is also cut at a quiet point (cutQuiet). The
// search: first the window, the shortest illegal prefix
// (by call time) and then the latest start keeping it illegal, each by bisection in O(log n) checks; then
// chunks of the rest, halving down to single ops, until no op can go (a greedy one-by-one pass), or the
// time is up. What it returns is illegal either way.
func Shrink(model porcupine.Model, name string, ops []porcupine.Operation, uniqueWrites bool, budget time.Duration) []porcupine.Operation {
	deadline := time.Now().Add(budget)
	cur := append([]porcupine.Operation(nil), ops...)
	sort.SliceStable(cur, func(i, j int) bool { return cur[i].Call < cur[j].Call })
	register := name == "register" && uniqueWrites
	counter := name == "counter"
	// repair adds back to keep (a choice of cur's ops) the ops its kept reads need, so that dropping the
	// others is sound by the rules above.
	repair := func(keep []bool) []porcupine.Operation {
		putAt := map[int64]int{} // register: the put of each value, by index in cur
		for i, op := range cur {
			if in := op.Input.(Input); in.Kind == "put" {
				putAt[in.Value] = i
			}
		}
		lastRead := int64(-1 << 63)
		for i, op := range cur {
			in, out := op.Input.(Input), op.Output.(Output)
			if !keep[i] || in.Kind != "get" {
				continue
			}
			if op.Return > lastRead {
				lastRead = op.Return
			}
			if register && out.Found {
				if j, ok := putAt[out.Value]; ok {
					keep[j] = true
				}
			}
		}
		var w []porcupine.Operation
		for i, op := range cur {
			k := op.Input.(Input).Kind
			switch {
			case k == "put" && !register, k == "add" && (!counter || op.Call <= lastRead):
				keep[i] = true
			}
			if keep[i] {
				w = append(w, op)
			}
		}
		return w
	}
	without := func(lo, hi int) []porcupine.Operation { // cur less the ops in [lo, hi), repaired
		keep := make([]bool, len(cur))
		for i := range cur {
			keep[i] = i < lo || i >= hi
		}
		return repair(keep)
	}
	window := func(lo, hi int) []porcupine.Operation { // cur's ops in [lo, hi), repaired
		keep := make([]bool, len(cur))
		for i := lo; i < hi; i++ {
			keep[i] = true
		}
		return repair(keep)
	}
	illegal := func(s []porcupine.Operation) bool {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		return porcupine.CheckOperationsTimeout(model, s, left) == porcupine.Illegal
	}
	lo, hi := 0, len(cur) // invariant: window(0, hi) is illegal (the whole history is)
	for hi-lo > 1 {
		if mid := (lo + hi) / 2; illegal(window(0, mid)) {
			hi = mid
		} else {
			lo = mid
		}
	}
	start, end := 0, hi // invariant: window(start, hi) is illegal
	for end-start > 1 {
		if mid := (start + end) / 2; illegal(window(mid, hi)) {
			start = mid
		} else {
			end = mid
		}
	}
	cur = window(start, hi)
	if counter {
		cur = cutQuiet(cur, illegal)
	}
	for chunk := len(cur) / 2; chunk >= 1; chunk /= 2 {
		for changed := true; changed; {
			changed = false
			for i := 0; i < len(cur) && time.Now().Before(deadline); {
				end := i + chunk
				if end > len(cur) {
					end = len(cur)
				}
				cand := without(i, end)
				if len(cand) < len(cur) && illegal(cand) {
					cur = cand
					changed = chunk == 1 // one-by-one: pass again until nothing more goes
					continue
				}
				i = end
			}
		}
	}
	return cur
}

// cutQuiet replaces the start of a counter history, up to the latest quiet point that keeps it illegal, with
// one add of the sum of its adds. A quiet point T is one no operation spans: each returned by T or is called
// after it. Every linearization then orders all ops before T ahead of all ops after, and the total at T is
// the sum of the adds before it whatever their order, so one add of that sum (called at the first call,
// returning at T) stands for them: the cut history is linearizable whenever the whole one is. An
// indeterminate add never returns, so no point after its call is quiet.
func cutQuiet(ops []porcupine.Operation, illegal func([]porcupine.Operation) bool) []porcupine.Operation {
	if len(ops) < 2 {
		return ops
	}
	var quiet []int // i: ops[:i] all returned before ops[i] was called (ops are in call order)
	reach := ops[0].Return
	for i := 1; i < len(ops); i++ {
		if ops[i].Call > reach {
			quiet = append(quiet, i)
		}
		if ops[i].Return > reach {
			reach = ops[i].Return
		}
	}
	cut := func(i int) []porcupine.Operation {
		var sum int64
		adds := 0
		end := ops[0].Return
		for _, op := range ops[:i] {
			if in := op.Input.(Input); in.Kind == "add" {
				sum += in.Value
				adds++
			}
			if op.Return > end {
				end = op.Return
			}
		}
		if adds == 0 {
			return ops[i:]
		}
		in := ops[0].Input.(Input)
		rec := &Record{Process: -1, Client: -1, Key: in.Key, F: "add", Value: &sum, Call: ops[0].Call, Return: &end,
			Status: "ok", Detail: fmt.Sprintf("stands for the %d adds that returned before the rest was called", adds)}
		raw, _ := json.Marshal(rec)
		rec.Raw = raw
		first := porcupine.Operation{
			ClientId: ops[0].ClientId,
			Input:    Input{Kind: "add", Key: in.Key, Value: sum},
			Call:     ops[0].Call,
			Output:   Output{Known: true},
			Return:   end,
			Metadata: Meta{Rec: rec},
		}
		return append([]porcupine.Operation{first}, ops[i:]...)
	}
	// Bisection over the quiet points for the latest one whose cut is still illegal (lo: known illegal or the
	// whole history; quiet[hi] and later: not tried, or legal).
	best := ops
	lo, hi := -1, len(quiet)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if c := cut(quiet[mid]); illegal(c) {
			best, lo = c, mid
		} else {
			hi = mid
		}
	}
	return best
}
