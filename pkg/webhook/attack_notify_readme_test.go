package webhook_test

import (
	"os"
	"strings"
	"testing"
)

// TestAttackREADMEReceiverShowsNotify breaks "a notify stage sends the
// user nothing" at the one place a guide webhook's author is told what to
// do with a request. With STILLTHERE_SENDER=webhook, notify stages go to
// the guide webhook's URL by default (STILLTHERE_NOTIFY_URL defaults to
// STILLTHERE_WEBHOOK_URL), yet README.md's "Guide webhook" section, whose
// receiver code readme_test.go keeps verbatim, says of every request
// "Parse body; show the user the guide unless its id was shown; 200",
// and never names the notify action. A receiver written from it, or one
// written before notify stages existed, shows the user an empty guide
// for each notify stage; one that refuses an empty text answers 400 and
// the notify is dead-lettered. docs/protocol.md's "Changed" note warns
// receivers about final only. The section must tell a receiver that a
// request with action notify is not shown to the user.
func TestAttackREADMEReceiverShowsNotify(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Guide webhook\n")
	if !ok {
		t.Fatal("README.md has no Guide webhook section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "show the user the guide") {
		t.Fatal("the section no longer tells receivers to show every guide: the test does not set up the case")
	}
	if !strings.Contains(section, "notify") {
		t.Errorf("README.md's Guide webhook section tells receivers to show the user every guide and never mentions notify stages, " +
			"which reach the same URL by default with sender=webhook")
	}
}
