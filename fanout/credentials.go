package fanout

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/authtoken"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// credentials are what the client listener checks clients with beyond the
// one auth token: its TLS files (certificate, key, client CA) and the named
// tokens, re-read when they change, and the re-check of the sessions after
// every change put in force (a revoked token or certificate ends its
// sessions).
type credentials struct {
	opts    Options
	log     *logrus.Entry
	tls     *tlsconf.Server // nil without Options.ClientTLS
	tokens  *authtoken.File // nil without Options.AuthTokensFile
	recheck chan struct{}   // capacity 1: the tokens or the client CA changed

	// reauthorize ends the sessions whose credentials are no longer
	// accepted and returns how many (the server's Reauthorize); set once
	// the server exists.
	reauthorize func() int
}

// newCredentials loads the files opts names.
func newCredentials(opts Options, log *logrus.Entry) (*credentials, error) {
	c := &credentials{opts: opts, log: log, recheck: make(chan struct{}, 1)}
	var err error
	if opts.ClientTLS.Set() {
		if c.tls, err = tlsconf.NewServer(opts.ClientTLS, c.tlsReloaded); err != nil {
			return nil, fmt.Errorf("client listener TLS: %w", err)
		}
	}
	if opts.AuthTokensFile != "" {
		if c.tokens, err = authtoken.Open(opts.AuthTokensFile, c.tokensReloaded); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// serverChecks returns what the server checks clients with: the TLS
// configuration, the named tokens' check and the client certificates'
// (each nil when not in use).
func (c *credentials) serverChecks() (listener *tlsconf.Server, authenticate func([sha256.Size]byte) (string, bool),
	verifyClient func([]*x509.Certificate) error) {
	if c.tokens != nil {
		authenticate = c.tokens.CheckSum
	}
	if c.mutualTLS() {
		verifyClient = c.tls.VerifyClient
	}
	return c.tls, authenticate, verifyClient
}

// mutualTLS reports whether clients must present certificates.
func (c *credentials) mutualTLS() bool { return c.tls != nil && c.tls.MutualTLS() }

// reload re-reads every file now and re-checks the sessions.
func (c *credentials) reload() {
	if c.tls != nil {
		_ = c.tls.Reload()
	}
	if c.tokens != nil {
		_ = c.tokens.Reload()
	}
	c.check()
}

// credentialsPoll is how often watch looks for changed files: a few stat
// calls.
const credentialsPoll = time.Second

// watch re-reads the named tokens and the client listener's TLS files when
// they change (looked for every credentialsPoll), and, after every change
// put in force, ends the sessions whose credentials are no longer
// accepted, until ctx ends. Without named tokens or a client CA it returns
// at once: nothing to revoke.
func (c *credentials) watch(ctx context.Context) {
	if c.tokens == nil && !c.mutualTLS() {
		return
	}
	tick := time.NewTicker(credentialsPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if c.tokens != nil {
				c.tokens.Refresh()
			}
			if c.tls != nil {
				c.tls.Refresh()
			}
		case <-c.recheck:
			c.check()
		}
	}
}

// check ends the sessions whose credentials are no longer accepted, and
// logs how many.
func (c *credentials) check() {
	if n := c.reauthorize(); n > 0 {
		c.log.WithField("sessions", n).Warn("client credentials changed: the sessions they no longer accept were ended")
	}
}

// changed has watch re-check the sessions; it never blocks (the files'
// readers call it).
func (c *credentials) changed() {
	select {
	case c.recheck <- struct{}{}:
	default:
	}
}

// tlsReloaded logs the outcome of re-reading the listener's TLS files.
func (c *credentials) tlsReloaded(err error) {
	log := c.log.WithFields(logrus.Fields{"tls_cert": c.opts.ClientTLS.Cert, "tls_client_ca": c.opts.ClientTLS.ClientCA})
	if err != nil {
		log.WithError(err).Error("client TLS files changed but do not load: the previous certificate stays in force")
		return
	}
	log.Info("client TLS files reloaded: new connections use them, sessions whose certificate they no longer accept end")
	c.changed()
}

// tokensReloaded logs the outcome of re-reading the named tokens; never a
// token.
func (c *credentials) tokensReloaded(err error) {
	log := c.log.WithField("auth_tokens_file", c.opts.AuthTokensFile)
	if err != nil {
		log.WithError(err).Error("client tokens file changed but does not load: the previous tokens stay in force")
		return
	}
	log.WithField("tokens", c.tokens.Len()).Info("client tokens file reloaded: new connections use it, sessions whose token it no longer holds end")
	c.changed()
}

// describe describes the client listener's protection for the first log
// line; never a secret.
func (c *credentials) describe() string {
	s := "plain text"
	switch {
	case c.mutualTLS():
		s = "mutual TLS"
	case c.tls != nil:
		s = "TLS"
	}
	if c.opts.AuthToken != "" {
		s += ", auth token"
	}
	if c.tokens != nil {
		s += fmt.Sprintf(", %d named tokens", c.tokens.Len())
	}
	return s
}
