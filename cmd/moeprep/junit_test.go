package main

import (
	"encoding/xml"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// checkJUnitSchema holds a document to what the JUnit XML schema CI
// systems read (Jenkins' junit-10.xsd, which GitHub's and GitLab's
// reporters follow) requires of it: a testsuites root; each testsuite with
// name, tests, failures, errors and time, its counts equal to its cases;
// each testcase with classname, name and time; at most one failure or
// skipped element in a case, a failure with a message.
func checkJUnitSchema(t *testing.T, b []byte) {
	t.Helper()
	type cas struct {
		Attrs   []xml.Attr `xml:",any,attr"`
		Failure []struct {
			Message string `xml:"message,attr"`
		} `xml:"failure"`
		Skipped []struct{} `xml:"skipped"`
	}
	var doc struct {
		XMLName xml.Name
		Suites  []struct {
			Attrs []xml.Attr `xml:",any,attr"`
			Cases []cas      `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if doc.XMLName.Local != "testsuites" || len(doc.Suites) == 0 {
		t.Fatalf("root %q with %d suites, want testsuites with at least one", doc.XMLName.Local, len(doc.Suites))
	}
	attrs := func(as []xml.Attr) map[string]string {
		m := map[string]string{}
		for _, a := range as {
			m[a.Name.Local] = a.Value
		}
		return m
	}
	for _, s := range doc.Suites {
		a := attrs(s.Attrs)
		for _, k := range []string{"name", "tests", "failures", "errors", "time"} {
			if _, ok := a[k]; !ok {
				t.Errorf("testsuite lacks %s", k)
			}
		}
		fails := 0
		for _, c := range s.Cases {
			ca := attrs(c.Attrs)
			for _, k := range []string{"classname", "name", "time"} {
				if ca[k] == "" {
					t.Errorf("testcase %v lacks %s", ca, k)
				}
			}
			if len(c.Failure)+len(c.Skipped) > 1 || len(c.Failure) == 1 && c.Failure[0].Message == "" {
				t.Errorf("testcase %v: %d failures, %d skipped", ca, len(c.Failure), len(c.Skipped))
			}
			fails += len(c.Failure)
		}
		if a["tests"] != fmt.Sprint(len(s.Cases)) || a["failures"] != fmt.Sprint(fails) || a["errors"] != "0" {
			t.Errorf("testsuite counts %v, cases %d, failures %d", a, len(s.Cases), fails)
		}
	}
}

// junitDoc is what a CI system reads of --junit's file.
type junitDoc struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Suites   []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Class   string `xml:"classname,attr"`
			Name    string `xml:"name,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// --junit writes one test case per check and layer plus the byte proof,
// read back here as a CI system reads it; a corrupted expert is a failed
// case naming the rule, and under GITHUB_ACTIONS an ::error annotation;
// a file that is not moeprep's JUnit is never overwritten.
func TestValidateJUnit(t *testing.T) {
	src := filepath.Join("..", "..", "fixtures", "hf", "qwen3-moe")
	dst := filepath.Join(t.TempDir(), "out")
	if code, _, errOut := runCLI(t, "convert", "-q", src, dst); code != 0 {
		t.Fatal(errOut)
	}
	junit := filepath.Join(t.TempDir(), "report.xml")
	read := func() junitDoc {
		t.Helper()
		var d junitDoc
		checkJUnitSchema(t, testkit.ReadFile(t, junit))
		if err := xml.Unmarshal(testkit.ReadFile(t, junit), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	code, _, errOut := runCLI(t, "validate", "--device", "cpu", "-q", "--junit", junit, src, dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	d := read()
	if d.Tests < 5 || d.Failures != 0 || len(d.Suites) != 1 || d.Suites[0].Name != "moeprep validate" {
		t.Fatalf("%+v", d)
	}
	var bytesCase, layerCase bool
	for _, c := range d.Suites[0].Cases {
		bytesCase = bytesCase || c.Class == "bytes" && c.Name == "byte proof"
		layerCase = layerCase || c.Class == "layer 1" && c.Name == "fused-vs-reference"
	}
	if !bytesCase || !layerCase {
		t.Errorf("cases %+v", d.Suites[0].Cases)
	}
	// Corrupt one expert's rows: the layer checks and the byte proof fail.
	flipTensor(t, dst, "model.layers.1.mlp.experts.all_down.weight")
	t.Setenv("GITHUB_ACTIONS", "true")
	code, _, errOut = runCLI(t, "validate", "--device", "cpu", "-q", "--junit", junit, src, dst)
	if code != 1 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	d = read()
	if d.Failures == 0 || !strings.Contains(errOut, "::error title=moeprep validate: layer 1 ") || !strings.Contains(errOut, "::error title=moeprep validate: bytes::") {
		t.Errorf("failures %d; stderr %s", d.Failures, errOut)
	}
	other := filepath.Join(t.TempDir(), "other.xml")
	testkit.WriteFile(t, other, []byte("<testsuites name=\"pytest\"/>"))
	code, _, errOut = runCLI(t, "validate", "--device", "cpu", "-q", "--junit", other, src, dst)
	if code != 2 || !strings.Contains(errOut, "exists and is not a JUnit report moeprep wrote") {
		t.Errorf("over another file: exit %d, %s", code, errOut)
	}
}

// flipTensor flips the sign bit of every other bf16 value of a tensor's
// first 64 bytes in whichever shard of dir holds it.
func flipTensor(t *testing.T, dir, name string) {
	t.Helper()
	shards, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	for _, p := range shards {
		h, err := testkit.ParseSTHeader(testkit.ReadFile(t, p))
		if err != nil {
			t.Fatal(err)
		}
		if ti, ok := h.Tensors[name]; ok {
			for i := int64(1); i < 64; i += 4 {
				testkit.FlipBits(t, p, h.DataStart+ti.DataOffsets[0]+i, 0x80)
			}
			return
		}
	}
	t.Fatalf("%s: no tensor %s", dir, name)
}
