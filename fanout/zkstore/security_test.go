package zkstore

import (
	"slices"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

const testAuth = "fanout:zk-pa55word-never-logged"

func TestACLFor(t *testing.T) {
	digest := zk.DigestACL(zk.PermAll, "fanout", "zk-pa55word-never-logged")[0]
	read := zk.ACL{Perms: zk.PermRead, Scheme: "world", ID: "anyone"}
	readCreate := zk.ACL{Perms: zk.PermRead | zk.PermCreate, Scheme: "world", ID: "anyone"}
	world, auth := Security{Auth: testAuth}, Security{Auth: testAuth, ReadACL: ReadAuth}
	tests := []struct {
		name   string
		sec    Security
		chroot string
		znode  string
		want   []zk.ACL
	}{
		{"no auth: open as before", Security{}, "", "/consumers/fanout_a/offsets/t/0", zk.WorldACL(zk.PermAll)},
		{"no auth: shared parent", Security{}, "", "/consumers", zk.WorldACL(zk.PermAll)},
		{"own znode, read world (default)", world, "", "/consumers/fanout_a/offsets/t/0", []zk.ACL{digest, read}},
		{"own znode, read world", Security{Auth: testAuth, ReadACL: ReadWorld}, "", "/fanout/a", []zk.ACL{digest, read}},
		{"own znode, read auth", auth, "", "/fanout/a/t/leader", []zk.ACL{digest}},
		{"shared /consumers", auth, "", "/consumers", []zk.ACL{digest, readCreate}},
		{"shared /fanout", world, "", "/fanout", []zk.ACL{digest, readCreate}},
		{"chroot ancestor", auth, "/apps/fanout", "/apps", []zk.ACL{digest, readCreate}},
		{"chroot", auth, "/apps/fanout/", "/apps/fanout", []zk.ACL{digest, readCreate}},
		{"below the chroot", auth, "/apps/fanout", "/apps/fanout/consumers", []zk.ACL{digest, readCreate}},
		{"own znode below the chroot", auth, "/apps/fanout", "/apps/fanout/consumers/fanout_a", []zk.ACL{digest}},
		{"a sibling of the chroot is not shared", auth, "/apps/fanout", "/apps/fanoutx/consumers/fanout_a", []zk.ACL{digest}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.sec.ACL(tt.chroot).For(tt.znode); !slices.Equal(got, tt.want) {
				t.Fatalf("ACL(%q).For(%q) = %+v, want %+v", tt.chroot, tt.znode, got, tt.want)
			}
		})
	}
	if strings.Contains(digest.ID, "zk-pa55word") {
		t.Fatalf("the digest ACL holds the password: %q", digest.ID)
	}
}

func TestACLLets(t *testing.T) {
	acl := Security{Auth: testAuth}.ACL("")
	ours := zk.DigestACL(zk.PermAll, "fanout", "zk-pa55word-never-logged")
	theirs := zk.DigestACL(zk.PermAll, "mallory", "x")
	tests := []struct {
		name string
		acls []zk.ACL
		want bool
	}{
		{"world may do all", zk.WorldACL(zk.PermAll), true},
		{"world may write", zk.WorldACL(zk.PermWrite), true},
		{"world may only read", zk.WorldACL(zk.PermRead), false},
		{"ours alone", ours, false},
		{"ours and world read", acl.For("/fanout/a"), false},
		{"ours, and anyone may create children", acl.For("/fanout"), true},
		{"another identity", theirs, true},
		{"ours and another identity", append(slices.Clone(ours), theirs...), true},
		{"world may change the ACL", zk.WorldACL(zk.PermAdmin), true},
	}
	for _, tt := range tests {
		if got := acl.lets(tt.acls); got != tt.want {
			t.Errorf("%s: lets(%+v) = %v, want %v", tt.name, tt.acls, got, tt.want)
		}
	}
}

func TestSecurityValidate(t *testing.T) {
	tests := []struct {
		name string
		sec  Security
		want string // "" for valid
	}{
		{"zero", Security{}, ""},
		{"auth", Security{Auth: testAuth, ReadACL: ReadAuth}, ""},
		{"password with a colon", Security{Auth: "u:a:b"}, ""},
		{"no colon", Security{Auth: "fanout"}, "--zookeeper-auth: want user:password"},
		{"empty user", Security{Auth: ":p"}, "--zookeeper-auth: want user:password"},
		{"empty password", Security{Auth: "u:"}, "--zookeeper-auth: want user:password"},
		{"bad read", Security{Auth: testAuth, ReadACL: "all"}, `--zookeeper-acl-read "all": want world or auth`},
		{"read auth without auth", Security{ReadACL: ReadAuth}, "needs --zookeeper-auth"},
		{"CA unreadable", Security{TLSFiles: tlsconf.Files{CA: "/nonexistent.pem"}}, "--zookeeper-tls: CA file: open /nonexistent.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.sec.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "pa55word"):
				t.Fatalf("Validate() shows the password: %v", err)
			}
		})
	}
}

func TestSecurityStringAndWarnings(t *testing.T) {
	s := Security{Auth: testAuth, ReadACL: ReadAuth}
	if got, want := s.String(), "plain text, digest as fanout, read auth"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := (Security{TLS: true}).String(), "TLS, no auth"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	w := strings.Join(s.Warnings(), "\n")
	if !strings.Contains(w, "clear text") || strings.Contains(w, "pa55word") {
		t.Errorf("auth without TLS: Warnings() = %q", w)
	}
	if w := strings.Join((Security{}).Warnings(), "\n"); !strings.Contains(w, "no --zookeeper-auth") {
		t.Errorf("no auth: Warnings() = %q", w)
	}
	if w := (Security{Auth: testAuth, TLS: true}).Warnings(); len(w) != 0 {
		t.Errorf("auth over TLS: Warnings() = %q, want none", w)
	}
}
