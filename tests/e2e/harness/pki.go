package main

// Certificates and kubeconfigs for the loopback control plane: one CA signs the API server's
// serving certificate and every client certificate (admin, scheduler, nodes), and an RSA key
// signs service-account tokens. Everything lives in <dir>/pki so that `harness node` can mint
// its own node credentials, as a kubelet's TLS bootstrap would.

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const certValidity = 7 * 24 * time.Hour

// pki names the files of one control plane's key material.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

func (p pki) caCert() string   { return p.path("ca.crt") }
func (p pki) caKey() string    { return p.path("ca.key") }
func (p pki) saPub() string    { return p.path("sa.pub") }
func (p pki) saKey() string    { return p.path("sa.key") }
func (p pki) serveCrt() string { return p.path("apiserver.crt") }
func (p pki) serveKey() string { return p.path("apiserver.key") }

// create writes a fresh CA, the API server's serving pair and the service-account key pair.
func (p pki) create() error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	caKey, caCert, err := newCA()
	if err != nil {
		return err
	}
	if err := writePair(p.caCert(), p.caKey(), caCert, caKey); err != nil {
		return err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := p.signLeaf(serving, p.serveCrt(), p.serveKey()); err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(p.saPub(), "PUBLIC KEY", pub); err != nil {
		return err
	}
	return writePEM(p.saKey(), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))
}

func newCA() (*rsa.PrivateKey, *x509.Certificate, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpuweave-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, err
}

// signLeaf signs tmpl with the CA and writes the certificate and a new key.
func (p pki) signLeaf(tmpl *x509.Certificate, certPath, keyPath string) error {
	caCert, caKey, err := p.loadCA()
	if err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	return writePair(certPath, keyPath, cert, key)
}

func (p pki) loadCA() (*x509.Certificate, *rsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(p.caCert())
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(p.caKey())
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("CA files in %s are not PEM", p.dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParsePKCS1PrivateKey(kb.Bytes)
	return cert, key, err
}

// writeClientKubeconfig mints a client certificate for user (in groups) and writes a kubeconfig
// that reaches server with it.
func (p pki) writeClientKubeconfig(path, server, user string, groups []string) error {
	crt := p.path("client-" + user + ".crt")
	key := p.path("client-" + user + ".key")
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := p.signLeaf(tmpl, crt, key); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: p.caCert()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: crt, ClientKey: key}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}

func writePair(certPath, keyPath string, cert *x509.Certificate, key *rsa.PrivateKey) error {
	if err := writePEM(certPath, "CERTIFICATE", cert.Raw); err != nil {
		return err
	}
	return writePEM(keyPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
