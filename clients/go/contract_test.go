package liveness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// The fixtures of the contract are the marked JSON blocks of docs/protocol.md, read from
// it here (see clients/contract/scenarios.md): `<!-- contract: KIND -->` before a block
// makes it one document of KIND, `<!-- contract: KIND lines -->` one per line.

const protocolDoc = "../../docs/protocol.md"

type fixture struct {
	line int
	kind string
	text string
}

func fixtures(t *testing.T) []fixture {
	data, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatalf("the contract is %s: %v", protocolDoc, err)
	}
	lines := strings.Split(string(data), "\n")
	var out []fixture
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```json" {
			continue
		}
		end := i + 1
		for end < len(lines) && !strings.HasPrefix(lines[end], "```") {
			end++
		}
		marker := ""
		if i > 0 && strings.HasPrefix(lines[i-1], "<!-- contract: ") {
			marker = strings.TrimSuffix(strings.TrimPrefix(lines[i-1], "<!-- contract: "), " -->")
		}
		if marker == "" {
			t.Errorf("%s:%d: a json block without a contract marker", protocolDoc, i+1)
		}
		perLine := strings.HasSuffix(marker, " lines")
		kind := strings.TrimSuffix(marker, " lines")
		if perLine {
			for j := i + 1; j < end; j++ {
				if strings.TrimSpace(lines[j]) != "" {
					out = append(out, fixture{j + 1, kind, lines[j]})
				}
			}
		} else {
			out = append(out, fixture{i + 2, kind, strings.Join(lines[i+1:end], "\n")})
		}
		i = end
	}
	return out
}

// defaults are the values whose key a writer may leave out (docs/protocol.md says so of
// each); null is the absence of every optional key.
var defaults = map[string]any{
	"comm": "", "on_end": "leave", "grace_ms": json.Number("10000"), "labels": map[string]any{},
	"pending": false, "terminate": false, "wait": false, "waiters": json.Number("0"),
	"warnings": []any{}, "wrappers": []any{},
}

func isDefault(key string, v any) bool {
	return v == nil || reflect.DeepEqual(defaults[key], v)
}

// same reports how `again` (decoded and encoded by this client) differs from `written`.
func same(written, again any, path string) error {
	a, aok := written.(map[string]any)
	b, bok := again.(map[string]any)
	if aok && bok {
		keys := map[string]bool{}
		for k := range a {
			keys[k] = true
		}
		for k := range b {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			x, inA := a[k]
			y, inB := b[k]
			switch {
			case inA && inB:
				if err := same(x, y, path+"."+k); err != nil {
					return err
				}
			case inA && !isDefault(k, x):
				return fmt.Errorf("%s.%s (%v) is lost when read", path, k, x)
			case inB && !isDefault(k, y):
				return fmt.Errorf("%s.%s (%v) appears when written", path, k, y)
			}
		}
		return nil
	}
	xs, xok := written.([]any)
	ys, yok := again.([]any)
	if xok && yok && len(xs) == len(ys) {
		for i := range xs {
			if err := same(xs[i], ys[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if !reflect.DeepEqual(written, again) {
		return fmt.Errorf("%s is %v in the document, %v read back", path, written, again)
	}
	return nil
}

func generic(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	return v, d.Decode(&v)
}

// roundTrip decodes text into a new T, encodes it again, and compares.
func roundTrip[T any](text string) error {
	var typed T
	d := json.NewDecoder(strings.NewReader(text))
	d.DisallowUnknownFields()
	if err := d.Decode(&typed); err != nil {
		return err
	}
	again, err := json.Marshal(typed)
	if err != nil {
		return err
	}
	a, _ := generic([]byte(text))
	b, err := generic(again)
	if err != nil {
		return err
	}
	return same(a, b, "")
}

// checkWire decodes a line as a client does: a request has "op", a reply "ok", anything
// else is a stream message.
func checkWire(text string) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &keys); err != nil {
		return err
	}
	switch {
	case keys["op"] != nil:
		return roundTrip[request](text)
	case keys["ok"] != nil:
		if _, err := decodeReply([]byte(text)); err != nil {
			if _, refused := err.(*Error); !refused {
				return err
			}
		}
		return roundTrip[reply](text)
	}
	return roundTrip[Message](text)
}

func check(kind, text string) error {
	switch kind {
	case "identity":
		return roundTrip[Identity](text)
	case "exit_status":
		return roundTrip[ExitStatus](text)
	case "cause":
		return roundTrip[Cause](text)
	case "usage":
		return roundTrip[Usage](text)
	case "session":
		return roundTrip[Session](text)
	case "event":
		return roundTrip[Event](text)
	case "lock":
		return roundTrip[Lock](text)
	case "survivors":
		return roundTrip[Survivors](text)
	case "wire":
		return checkWire(text)
	case "doctor":
		return nil // the CLI's output, checked against the daemon's types in Rust
	}
	return fmt.Errorf("unknown contract kind %q", kind)
}

func TestContractFixturesDecode(t *testing.T) {
	all := fixtures(t)
	if len(all) < 40 {
		t.Fatalf("only %d fixtures in %s", len(all), protocolDoc)
	}
	kinds := map[string]int{}
	for _, f := range all {
		kinds[f.kind]++
		if err := check(f.kind, f.text); err != nil {
			t.Errorf("%s:%d (%s): %v", protocolDoc, f.line, f.kind, err)
		}
	}
	t.Logf("%d fixtures: %v", len(all), kinds)
}

func TestEveryDocumentedErrorCodeIsNamed(t *testing.T) {
	data, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, table, found := strings.Cut(string(data), "\n<!-- contract: error_codes -->\n")
	if !found {
		t.Fatal("no table marked error_codes")
	}
	var documented []Code
	for _, row := range strings.Split(table, "\n") {
		if !strings.HasPrefix(row, "|") {
			break
		}
		cell := strings.TrimSpace(strings.Split(row, "|")[1])
		if strings.HasPrefix(cell, "`") && strings.HasSuffix(cell, "`") {
			documented = append(documented, Code(strings.Trim(cell, "`")))
		}
	}
	if !reflect.DeepEqual(documented, ErrorCodes) {
		t.Fatalf("documented codes %v, this client names %v", documented, ErrorCodes)
	}
}

// A closed kind refuses a value it does not know; an open one keeps it, with the fields
// this client knows, and writes only those of a kind it knows.
func TestClosedKindsRefuseWhatTheyDoNotKnowAndOpenOnesKeepIt(t *testing.T) {
	var exit ExitStatus
	if err := json.Unmarshal([]byte(`{"kind":"vanished"}`), &exit); err == nil {
		t.Fatalf("an unknown exit kind was read: %+v", exit)
	}
	if _, err := json.Marshal(ExitStatus{Kind: "vanished"}); err == nil {
		t.Fatal("an unknown exit kind was written")
	}
	var cause Cause
	newer := `{"kind":"frozen","reason":"a newer daemon's cause"}`
	if err := json.Unmarshal([]byte(newer), &cause); err != nil || cause.Kind != "frozen" || cause.Reason == "" {
		t.Fatalf("a newer cause: %+v, %v", cause, err)
	}
	if out, err := json.Marshal(Cause{Kind: CauseExit, Code: 0, Reason: "ignored"}); err != nil || string(out) != `{"kind":"exit","code":0}` {
		t.Fatalf("an exit cause is written as %s, %v", out, err)
	}
	if out, err := json.Marshal(Session{Phase: Active, Until: UntilOwner, OnEnd: Leave}); err != nil || bytes.Contains(out, []byte(`"until"`)) {
		t.Fatalf("the default until is written: %s, %v", out, err)
	}
}

func TestClosedEnumsRefuseWhatTheyDoNotKnow(t *testing.T) {
	var s Session
	for _, bad := range []string{`{"phase":"paused"}`, `{"until":"forever"}`, `{"on_end":"explode"}`} {
		if err := json.Unmarshal([]byte(bad), &s); err == nil {
			t.Errorf("%s was read: %+v", bad, s)
		}
	}
	if err := json.Unmarshal([]byte(`{"reason":"a_newer_reason"}`), &s); err != nil || s.Reason != "a_newer_reason" {
		t.Errorf("an open enum refused a newer value: %+v, %v", s, err)
	}
}
