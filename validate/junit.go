package validate

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
)

// JUnitSuiteName names the one suite a report becomes; it also marks a
// file as moeprep's own, so --junit may replace it and nothing else.
const JUnitSuiteName = "moeprep validate"

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"` // always 0: a run that errs writes no report
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Props    []junitProp `xml:"properties>property,omitempty"`
	Cases    []junitCase `xml:"testcase"`
}

type junitProp struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Class   string        `xml:"classname,attr"`
	Name    string        `xml:"name,attr"`
	Time    string        `xml:"time,attr"`
	Failure *junitFailure `xml:"failure,omitempty"`
	Skipped *junitSkipped `xml:"skipped,omitempty"`
	Out     string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

func secs(s float64) string { return fmt.Sprintf("%.3f", s) }

// WriteJUnit writes the report as JUnit XML, which CI systems (GitHub
// Actions' test reporters, GitLab, Jenkins) read natively: one test case
// per check of each layer (class "layer L", name the check), one for the
// byte proof, a failure carrying the rule that failed; the layers the run
// left out are skipped cases, so a sampled run cannot pass for a whole one.
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: JUnitSuiteName, Time: secs(r.Seconds)}
	for _, k := range []struct{ name, value string }{{"mode", r.Mode}, {"device", string(r.Device)}, {"src", r.Src}, {"dst", r.Dst}, {"tool", r.Tool}} {
		if k.value != "" {
			s.Props = append(s.Props, junitProp{k.name, k.value})
		}
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		c := junitCase{Class: "layer " + row.label(), Name: row.Check, Time: secs(row.Seconds),
			Out: fmt.Sprintf("rel_l2 %.3g, max_abs %.3g, cosine %.6f against %s", row.RelL2, row.MaxAbs, row.Cosine, row.Tolerance.Name)}
		if !row.Pass {
			c.Failure = &junitFailure{Message: row.Reason, Type: row.Check,
				Text: fmt.Sprintf("layer %s %s: %s", row.label(), row.Check, row.Reason)}
		}
		s.Cases = append(s.Cases, c)
	}
	if b := r.Bytes; b != nil {
		c := junitCase{Class: "bytes", Name: "byte proof", Time: secs(b.Seconds),
			Out: fmt.Sprintf("%d tensors in %d files, %d copied files", b.Tensors, b.Files, b.Copies)}
		if !b.Pass {
			msg := "DST's bytes do not match SRC and the contract"
			if b.Mismatch != nil {
				msg = b.Mismatch.Error()
			}
			c.Failure = &junitFailure{Message: msg, Type: "bytes", Text: msg}
		}
		s.Cases = append(s.Cases, c)
	}
	for _, l := range r.LayersNotChecked {
		s.Cases = append(s.Cases, junitCase{Class: "layer " + fmt.Sprint(l), Name: "not checked", Time: secs(0),
			Skipped: &junitSkipped{Message: "left out by --layers " + r.LayerSelection}})
	}
	if len(r.Rows) == 0 && r.Bytes == nil {
		s.Cases = append(s.Cases, junitCase{Class: "validate", Name: "any check", Time: secs(0),
			Failure: &junitFailure{Message: "no layer was checked", Type: "validate"}})
	}
	for _, c := range s.Cases {
		s.Tests++
		switch {
		case c.Failure != nil:
			s.Failures++
		case c.Skipped != nil:
			s.Skipped++
		}
	}
	doc := junitSuites{Name: JUnitSuiteName, Tests: s.Tests, Failures: s.Failures, Time: s.Time, Suites: []junitSuite{s}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// WriteGitHubAnnotations writes one ::error workflow command per failed
// check (GitHub Actions shows them on the run's summary and the pull
// request), naming the layer and the check; nothing when all passed.
func (r *Report) WriteGitHubAnnotations(w io.Writer) error {
	esc := strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A")
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Pass {
			continue
		}
		if _, err := fmt.Fprintf(w, "::error title=moeprep validate: layer %s %s::%s\n", esc.Replace(row.label()), esc.Replace(row.Check), esc.Replace(row.Reason)); err != nil {
			return err
		}
	}
	if b := r.Bytes; b != nil && !b.Pass {
		msg := "DST's bytes do not match SRC and the contract"
		if b.Mismatch != nil {
			msg = b.Mismatch.Error()
		}
		if _, err := fmt.Fprintf(w, "::error title=moeprep validate: bytes::%s\n", esc.Replace(msg)); err != nil {
			return err
		}
	}
	return nil
}
