package markers

import "testing"

// TestReplace: the text between the markers is replaced and the rest kept;
// missing or misordered markers are errors.
func TestReplace(t *testing.T) {
	page := "# A\n<!-- b -->\nold\nolder\n<!-- e -->\ntail\n"
	got, err := Replace([]byte(page), "<!-- b -->", "<!-- e -->", []byte("new\n"))
	if want := "# A\n<!-- b -->\nnew\n<!-- e -->\ntail\n"; err != nil || string(got) != want {
		t.Errorf("Replace = %q, %v; want %q", got, err, want)
	}
	for name, p := range map[string]string{
		"no markers":   "# A\n",
		"no end":       "<!-- b -->\nold\n",
		"end first":    "<!-- e -->\n<!-- b -->\n",
		"begin inline": "x <!-- b --> y\n<!-- e -->\n",
	} {
		if _, err := Replace([]byte(p), "<!-- b -->", "<!-- e -->", nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
