package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are PEM files written by NewTLSFiles into a test's temporary
// directory: a CA, a server certificate for 127.0.0.1 and localhost, and a
// client certificate (common name "fanout-test-client"), both signed by the
// CA; and, for rotation and refusal tests, a second server certificate
// (common name "fanout-test-server-2") and an expired client certificate
// ("fanout-test-expired"), signed by the same CA.
type TLSFiles struct {
	CA                      string
	ServerCert, ServerKey   string
	ClientCert, ClientKey   string
	Server2Cert, Server2Key string
	ExpiredCert, ExpiredKey string
}

// NewTLSFiles generates a fresh CA and its certificates (ECDSA P-256, valid
// for a day) and writes them under t.TempDir().
func NewTLSFiles(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fanout test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("create CA: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("parse CA: %v", err)
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, f.CA, "CERTIFICATE", caDER)

	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, certPath, keyPath *string) {
		key := newKey(t)
		notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
		if name == "fanout-test-expired" {
			notBefore, notAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name, Organization: []string{"fanout tests"}},
			NotBefore:    notBefore,
			NotAfter:     notAfter,
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("create %s certificate: %v", name, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatalf("marshal %s key: %v", name, err)
		}
		*certPath, *keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, *certPath, "CERTIFICATE", der)
		writePEM(t, *keyPath, "PRIVATE KEY", keyDER)
	}
	leaf("fanout-test-server", 2, x509.ExtKeyUsageServerAuth, &f.ServerCert, &f.ServerKey)
	leaf("fanout-test-client", 3, x509.ExtKeyUsageClientAuth, &f.ClientCert, &f.ClientKey)
	leaf("fanout-test-server-2", 4, x509.ExtKeyUsageServerAuth, &f.Server2Cert, &f.Server2Key)
	leaf("fanout-test-expired", 5, x509.ExtKeyUsageClientAuth, &f.ExpiredCert, &f.ExpiredKey)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}
