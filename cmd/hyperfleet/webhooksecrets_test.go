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
