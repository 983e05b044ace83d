package zkstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// Who may read the znodes fanout creates (--zookeeper-acl-read).
const (
	ReadWorld = "world" // anyone (the default): offsets and the leader record are not secret
	ReadAuth  = "auth"  // only the identity of --zookeeper-auth
)

// Security is how fanout's ZooKeeper sessions authenticate and encrypt, and
// which ACL the znodes they create get: the --zookeeper-auth,
// --zookeeper-acl-read and --zookeeper-tls* flags. The zero value is plain
// text, no authentication, and znodes anyone may change (fanout's behaviour
// before these options existed).
type Security struct {
	// Auth is the digest identity "user:password" every session adds; ""
	// for none. A secret: it is never logged.
	Auth string
	// ReadACL is ReadWorld ("" means it) or ReadAuth. Writing is always
	// for Auth's identity alone when Auth is set.
	ReadACL string

	// TLS encrypts the sessions (the server's secureClientPort). Any
	// TLSFiles field set implies it.
	TLS      bool
	TLSFiles tlsconf.Files
}

// TLSEnabled reports whether sessions use TLS.
func (s Security) TLSEnabled() bool { return s.TLS || s.TLSFiles.Set() }

// user is the user name of Auth.
func (s Security) user() string {
	u, _, _ := strings.Cut(s.Auth, ":")
	return u
}

// Validate reports every problem with s in one error, naming the flags. It
// reads the TLS files, so an unreadable one is reported at start.
func (s Security) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Auth != "" {
		if u, p, ok := strings.Cut(s.Auth, ":"); !ok || u == "" || p == "" {
			bad("--zookeeper-auth: want user:password (from FANOUT_ZOOKEEPER_AUTH or --zookeeper-auth-file), with neither part empty")
		}
	}
	switch s.ReadACL {
	case "", ReadWorld:
	case ReadAuth:
		if s.Auth == "" {
			bad("--zookeeper-acl-read auth: needs --zookeeper-auth (FANOUT_ZOOKEEPER_AUTH or --zookeeper-auth-file)")
		}
	default:
		bad("--zookeeper-acl-read %q: want %s or %s", s.ReadACL, ReadWorld, ReadAuth)
	}
	if s.TLSEnabled() {
		if _, err := s.TLSFiles.Config(); err != nil {
			bad("--zookeeper-tls: %w", err)
		}
	}
	return errors.Join(errs...)
}

// Warnings lists what is legal but unsafe in s, for the operator to read
// once at start.
func (s Security) Warnings() []string {
	var w []string
	switch {
	case s.Auth == "":
		w = append(w, "no --zookeeper-auth: the znodes fanout creates (offsets, leader record) can be changed by anyone who reaches ZooKeeper")
	case !s.TLSEnabled():
		w = append(w, "--zookeeper-auth without --zookeeper-tls: the digest credentials cross the network in clear text")
	}
	if s.TLSFiles.InsecureSkipVerify {
		w = append(w, "--zookeeper-tls-insecure-skip-verify: ZooKeeper's certificate is not verified; for tests only")
	}
	return w
}

// String describes s for logs, without the password: "TLS, digest as
// fanout, read world", or "plain text, no auth".
func (s Security) String() string {
	t := "plain text"
	if s.TLSEnabled() {
		t = "TLS"
	}
	if s.Auth == "" {
		return t + ", no auth"
	}
	read := ReadWorld
	if s.ReadACL == ReadAuth {
		read = ReadAuth
	}
	return fmt.Sprintf("%s, digest as %s, read %s", t, s.user(), read)
}

// ACL returns the ACL of every znode created under s below chroot (from
// ParseServers; "" for none).
func (s Security) ACL(chroot string) ACL {
	if s.Auth == "" {
		return ACL{}
	}
	u, p, _ := strings.Cut(s.Auth, ":")
	id := zk.DigestACL(zk.PermAll, u, p)[0].ID // user:base64(sha1(user:password))
	chroot, _ = cleanChroot(chroot)
	return ACL{digest: id, worldRead: s.ReadACL != ReadAuth, chroot: chroot}
}

// Connect opens a ZooKeeper session with the servers, as the package's
// Connect does, over TLS when s says so, and authenticates it with s.Auth
// before returning it. go-zookeeper adds the credentials again to every
// later session of the connection (reconnects, a new session after
// expiry).
func (s Security) Connect(ctx context.Context, servers []string, sessionTimeout time.Duration, log *logrus.Entry) (*zk.Conn, error) {
	dial := zk.Dialer(net.DialTimeout)
	if s.TLSEnabled() {
		cfg, err := s.TLSFiles.Config()
		if err != nil {
			return nil, fmt.Errorf("zookeeper TLS: %w", err)
		}
		dial = tlsDialer(cfg)
	}
	conn, err := connect(ctx, servers, sessionTimeout, log, dial)
	if err != nil || s.Auth == "" {
		return conn, err
	}
	if err := conn.AddAuth("digest", []byte(s.Auth)); err != nil {
		conn.Close()
		hosts, _, _ := ParseServers(servers)
		return nil, fmt.Errorf("zookeeper at %s: add digest credentials of user %q: %w", strings.Join(hosts, ","), s.user(), err)
	}
	return conn, nil
}

// tlsDialer dials ZooKeeper servers over TLS with cfg, verifying each
// server's certificate against its host name (or IP address).
func tlsDialer(cfg *tls.Config) zk.Dialer {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		c := cfg.Clone()
		if c.ServerName == "" {
			if host, _, err := net.SplitHostPort(address); err == nil {
				c.ServerName = host
			}
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, network, address, c)
		if err != nil {
			return nil, fmt.Errorf("TLS to zookeeper %s: %w", address, err)
		}
		return conn, nil
	}
}

// ACL is the access list of every znode fanout creates: the offsets znodes
// and their parents (Store), the cluster's fence znode and its parents. It
// is the one place that decides it; get it from Security.ACL. The zero
// value lets anyone do anything (no --zookeeper-auth). With an identity:
//
//   - znodes of this fanout instance (/consumers/fanout_<id>/..., /fanout/<id>/...):
//     the identity may do everything; anyone may read them with ReadWorld, nobody
//     else with ReadAuth.
//   - shared parents (the chroot, its ancestors, and the znodes right below it:
//     /consumers, /fanout), which every fanout instance and other tools create
//     children in: the identity may do everything, anyone may read them and
//     create children (but not change, delete or re-permission them).
type ACL struct {
	digest    string // digest id user:base64(sha1(user:password)); "" for world:anyone
	worldRead bool   // with digest: anyone may read this instance's znodes
	chroot    string // znodes at or above it, and right below it, are shared
}

// For is the ACL to create znode (an absolute path, chroot included) with.
func (a ACL) For(znode string) []zk.ACL {
	if a.digest == "" {
		return zk.WorldACL(zk.PermAll)
	}
	l := []zk.ACL{{Perms: zk.PermAll, Scheme: "digest", ID: a.digest}}
	switch {
	case a.shared(znode):
		l = append(l, zk.ACL{Perms: zk.PermRead | zk.PermCreate, Scheme: "world", ID: "anyone"})
	case a.worldRead:
		l = append(l, zk.ACL{Perms: zk.PermRead, Scheme: "world", ID: "anyone"})
	}
	return l
}

// shared reports whether znode is the chroot, above it, or right below it.
func (a ACL) shared(znode string) bool {
	if a.chroot == znode || strings.HasPrefix(a.chroot, znode+"/") {
		return true
	}
	rel, ok := strings.CutPrefix(znode, a.chroot+"/")
	return ok && !strings.Contains(rel, "/")
}

// lets reports whether acls let someone other than a's identity do more
// than read a znode.
func (a ACL) lets(acls []zk.ACL) bool {
	for _, e := range acls {
		if e.Perms&^zk.PermRead == 0 {
			continue
		}
		if a.digest != "" && e.Scheme == "digest" && e.ID == a.digest {
			continue
		}
		return true
	}
	return false
}

// Open returns the existing znodes among those this fanout instance owns
// for paths (each a Store's Path or a fence path, with the chroot) that
// someone other than a's identity may change: each path, its children, and
// its ancestors below the shared parents (see ACL). A zero a (no identity)
// owns nothing and returns nil.
func (a ACL) Open(conn *zk.Conn, paths ...string) ([]string, error) {
	if a.digest == "" {
		return nil, nil
	}
	var check []string
	for _, p := range paths {
		for dir := path.Dir(p); !a.shared(dir) && dir != "/"; dir = path.Dir(dir) {
			check = append(check, dir)
		}
		check = append(check, p)
		children, _, err := conn.Children(p)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil, fmt.Errorf("zkstore: list %s: %w", p, err)
		}
		for _, c := range children {
			check = append(check, p+"/"+c)
		}
	}
	slices.Sort(check)
	check = slices.Compact(check)
	var open []string
	for _, p := range check {
		acls, _, err := conn.GetACL(p)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("zkstore: ACL of %s: %w", p, err)
		}
		if a.lets(acls) {
			open = append(open, p)
		}
	}
	return open, nil
}

// WarnOpen logs, once, the znodes Open finds, or at debug level why it
// could not look.
func (a ACL) WarnOpen(conn *zk.Conn, log *logrus.Entry, paths ...string) {
	open, err := a.Open(conn, paths...)
	switch {
	case err != nil:
		log.WithError(err).Debug("could not check the ACLs of existing znodes")
	case len(open) > 0:
		log.WithField("znodes", open).Warn("znodes that someone other than --zookeeper-auth's user may change " +
			"(created before --zookeeper-auth, or by someone else): whoever reaches ZooKeeper can rewrite them; " +
			"set their ACL (zkCli setAcl) or delete them while no daemon runs")
	}
}

// noAuthHint adds the likely cause to an error that is zk.ErrNoAuth.
func noAuthHint(err error) error {
	if errors.Is(err, zk.ErrNoAuth) {
		return fmt.Errorf("%w (the znode's ACL does not allow this session's identity: check --zookeeper-auth)", err)
	}
	return err
}
