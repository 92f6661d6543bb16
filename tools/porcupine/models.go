package main

// The sequential specifications a history is checked against, one key at a time.

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// regState is one key of a register: missing, or holding V.
type regState struct {
	Set bool
	V   int64
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	keys, m := ByKey(history)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

func describeOutput(out Output) string {
	switch {
	case !out.Known:
		return "?"
	case !out.Found:
		return "missing"
	default:
		return fmt.Sprint(out.Value)
	}
}

func describeMeta(m interface{}) string {
	meta, ok := m.(Meta)
	if !ok || meta.Rec == nil {
		return ""
	}
	r := meta.Rec
	s := fmt.Sprintf("line %d, process %d, %s", r.Line, r.Process, r.Status)
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// RegisterModel: put(v) stores v; get returns the stored value, or missing before any put.
var RegisterModel = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() interface{} { return regState{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s := state.(regState)
		in := input.(Input)
		out := output.(Output)
		switch in.Kind {
		case "put":
			return true, regState{Set: true, V: in.Value}
		case "get":
			if !out.Found {
				return !s.Set, s
			}
			return s.Set && s.V == out.Value, s
		}
		return false, s
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(Input)
		out := output.(Output)
		if in.Kind == "get" {
			return fmt.Sprintf("get(%s) -> %s", in.Key, describeOutput(out))
		}
		if !out.Known {
			return fmt.Sprintf("put(%s, %d) ?", in.Key, in.Value)
		}
		return fmt.Sprintf("put(%s, %d)", in.Key, in.Value)
	},
	DescribeState: func(state interface{}) string {
		s := state.(regState)
		if !s.Set {
			return "missing"
		}
		return fmt.Sprint(s.V)
	},
	DescribeOperationMetadata: describeMeta,
}

// CounterModel: add(d) merges d into the total (merge="add"); get returns the total, or missing while
// nothing was added. An indeterminate add needs nothing special here: its return is the end of the history
// (History.End), so the checker may place it before a read that counted it or after every read that did not.
var CounterModel = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() interface{} { return regState{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s := state.(regState)
		in := input.(Input)
		out := output.(Output)
		switch in.Kind {
		case "add":
			return true, regState{Set: true, V: s.V + in.Value}
		case "get":
			if !out.Found {
				return !s.Set, s
			}
			return s.Set && s.V == out.Value, s
		}
		return false, s
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(Input)
		out := output.(Output)
		if in.Kind == "get" {
			return fmt.Sprintf("get(%s) -> %s", in.Key, describeOutput(out))
		}
		if !out.Known {
			return fmt.Sprintf("add(%s, %d) ?", in.Key, in.Value)
		}
		return fmt.Sprintf("add(%s, %d)", in.Key, in.Value)
	},
	DescribeState: func(state interface{}) string {
		s := state.(regState)
		if !s.Set {
			return "missing"
		}
		return fmt.Sprint(s.V)
	},
	DescribeOperationMetadata: describeMeta,
}

// ModelNamed returns the model a flag names, and the op kind that writes under it.
func ModelNamed(name string) (porcupine.Model, string, error) {
	switch name {
	case "register":
		return RegisterModel, "put", nil
	case "counter":
		return CounterModel, "add", nil
	}
	return porcupine.Model{}, "", fmt.Errorf("unknown model %q (register or counter)", name)
}
