package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ServerFiles names the PEM files of a TLS server: its certificate and key,
// and optionally the CA bundle that must sign every client's certificate
// (mutual TLS).
type ServerFiles struct {
	Cert     string // the server's certificate chain
	Key      string // its private key (unencrypted PEM)
	ClientCA string // when set, clients must present a certificate this CA signs
}

// Set reports whether any field is set.
func (f ServerFiles) Set() bool { return f != ServerFiles{} }

// Validate checks that the fields make a server: a certificate and a key,
// both or neither, and no client CA without them. It reads no file.
func (f ServerFiles) Validate() error {
	switch {
	case !f.Set():
		return nil
	case f.Cert == "" || f.Key == "":
		return errors.New("a TLS listener needs both a certificate file and its key file")
	}
	return nil
}

// stamp identifies one version of a file: a rewrite or a rename over it
// changes the modification time or the size.
type stamp struct {
	mod  time.Time
	size int64
}

// Server is the TLS configuration of a listener that re-reads its files
// when they change, so that a renewed certificate takes effect without a
// restart: each handshake checks the files' modification times and sizes
// (three stat calls per connection, never per message), and Reload re-reads
// them at once (SIGHUP). A new version that does not load (a certificate
// renewed before its key) leaves the previous one in force.
type Server struct {
	files    ServerFiles
	onReload func(error) // told the outcome of each re-read after the first

	mu     sync.Mutex  // guards the fields below
	cur    *tls.Config // the configuration handshakes use now
	stamps [3]stamp    // of the files cur was read from
}

// NewServer reads the files and returns the listener's configuration.
// onReload, when not nil, is told the outcome of every later re-read: nil
// when the new files are in force, else why the previous ones stay.
func NewServer(f ServerFiles, onReload func(error)) (*Server, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s := &Server{files: f, onReload: onReload}
	st := s.stat()
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	s.cur, s.stamps = cfg, st
	return s, nil
}

// Config returns the configuration to give tls.Server: every handshake asks
// the Server for the files' current version.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return s.current(), nil },
	}
}

// MutualTLS reports whether clients must present a certificate.
func (s *Server) MutualTLS() bool { return s.files.ClientCA != "" }

// Reload re-reads the files now, whether or not they changed. On error the
// previous configuration stays in force.
func (s *Server) Reload() error {
	st := s.stat()
	cfg, err := s.files.load()
	s.mu.Lock()
	if err == nil {
		s.cur = cfg
	}
	s.stamps = st // a broken version is not retried until it changes again
	s.mu.Unlock()
	if s.onReload != nil {
		s.onReload(err)
	}
	return err
}

// Refresh re-reads the files if they changed since the last read, telling
// onReload the outcome; the daemon calls it periodically, so that a change
// takes effect without waiting for the next handshake.
func (s *Server) Refresh() { s.current() }

// VerifyClient checks a client's certificate chain (the leaf first) as a
// handshake under the files' current version would: signed by the client
// CA, through the chain's intermediates, valid now, for client
// authentication. Without a client CA every chain passes.
func (s *Server) VerifyClient(chain []*x509.Certificate) error {
	cfg := s.current()
	if cfg.ClientCAs == nil {
		return nil
	}
	if len(chain) == 0 {
		return errors.New("no client certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: cfg.ClientCAs, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

// current returns the configuration of the files' current version,
// re-reading them when they changed since the last read.
func (s *Server) current() *tls.Config {
	st := s.stat()
	s.mu.Lock()
	changed := st != s.stamps
	cur := s.cur
	s.mu.Unlock()
	if !changed {
		return cur
	}
	_ = s.Reload() // reported through onReload
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// stat returns the stamps of the files; a missing file has the zero stamp.
func (s *Server) stat() [3]stamp {
	var out [3]stamp
	for i, name := range []string{s.files.Cert, s.files.Key, s.files.ClientCA} {
		if name == "" {
			continue
		}
		if fi, err := os.Stat(name); err == nil {
			out[i] = stamp{mod: fi.ModTime(), size: fi.Size()}
		}
	}
	return out
}

// load reads the files into a server configuration.
func (f ServerFiles) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", f.Cert, f.Key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if f.ClientCA != "" {
		pem, err := os.ReadFile(f.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA file %s: no PEM certificate in it", f.ClientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
