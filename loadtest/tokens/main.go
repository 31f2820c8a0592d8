// Command tokens writes client tokens for a load test, one JWT a line, so
// that the k6 scripts can run without the token secret (TOKENS_FILE):
//
//	STILLTHERE_TOKEN_SECRET=... go run ./loadtest/tokens -n 20000 > tokens.txt
//
// Each token is for its own user, <prefix><i>. The prefix is random unless
// given, so that the users of one run are never those of another: the
// expiry listener dedups per user and minute, and a guide left in a user's
// inbox is sent on their next connect. Mint a fresh file for every run.
package main

import (
	"bufio"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/stillthere/stillthere/pkg/token"
)

func main() {
	n := flag.Int("n", 1000, "tokens to write")
	secret := flag.String("secret", "", "token secret (default $STILLTHERE_TOKEN_SECRET): the load-test gateway's, never a production one")
	prefix := flag.String("prefix", "", "user id prefix (default lt-<random>-)")
	seg := flag.String("seg", "", "segment claim (default none: the gateway's default segment)")
	ttl := flag.Duration("ttl", 24*time.Hour, "token lifetime")
	flag.Parse()
	if *secret == "" {
		*secret = os.Getenv("STILLTHERE_TOKEN_SECRET")
	}
	if *prefix == "" {
		*prefix = "lt-" + rand.Text()[:8] + "-"
	}
	if err := run(os.Stdout, []byte(*secret), *n, *prefix, *seg, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "tokens:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, secret []byte, n int, prefix, seg string, ttl time.Duration) error {
	if len(secret) < token.MinSecretLen {
		return fmt.Errorf("-secret or STILLTHERE_TOKEN_SECRET: %d bytes, want the gateway's token secret (at least %d)", len(secret), token.MinSecretLen)
	}
	if n < 1 {
		return fmt.Errorf("-n: %d, want at least 1", n)
	}
	w := bufio.NewWriter(out)
	for i := range n {
		tok, err := token.Mint(secret, fmt.Sprintf("%s%d", prefix, i), seg, ttl)
		if err != nil {
			return err
		}
		fmt.Fprintln(w, tok)
	}
	return w.Flush()
}
