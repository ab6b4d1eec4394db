package main

import (
	"strings"
	"testing"
	"time"
)

func TestCheckMaxEventAge(t *testing.T) {
	for d, ok := range map[time.Duration]bool{time.Minute: true, 15 * time.Minute: true, 16 * time.Minute: false, 0: false, -time.Second: false} {
		if err := checkMaxEventAge(d); (err == nil) != ok {
			t.Errorf("checkMaxEventAge(%s) = %v", d, err)
		} else if err != nil && !strings.Contains(err.Error(), "--webhook-max-event-age") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}

func TestCheckScriptUser(t *testing.T) {
	for name, ok := range map[string]bool{"runner": true, "_ci": true, "ci-user_2": true, "": false, "Runner": false, "root:x": false, "1ci": false, strings.Repeat("a", 33): false} {
		if err := checkScriptUser(name); (err == nil) != ok {
			t.Errorf("checkScriptUser(%q) = %v", name, err)
		} else if err != nil && !strings.Contains(err.Error(), "--generic-script-user") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}
