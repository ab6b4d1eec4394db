// Command sign-image signs a multi-arch image that make release wrote as an
// OCI image layout, offline, and writes the signed image as cosign lays one
// out on disk (`cosign save`), so that
//
//	cosign verify --local-image <out> --key cosign.pub --insecure-ignore-tlog
//
// verifies it without a registry. cosign's `sign` needs a registry to put the
// signature in; make release pushes nothing, so this does what `cosign sign
// --key` does (the simple-signing payload naming the index's digest, signed
// with the cosign key) with cosign's own packages, and writes the index and
// its signature with cosign's layout writer.
//
//	sign-image --layout dist/image-unsigned --out dist/image \
//	    --key cosign.key --reference ghcr.io/hyperfleet/hyperfleet
//
// The key's password is read from COSIGN_PASSWORD, as cosign reads it.
package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	gcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/cosign/v2/pkg/oci/layout"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	"github.com/sigstore/cosign/v2/pkg/oci/signed"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sign-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sign-image", flag.ContinueOnError)
	in := fs.String("layout", "", "OCI image layout holding one image index (podman manifest push --all ... oci:DIR)")
	out := fs.String("out", "", "directory to write the signed layout into (must not exist)")
	keyPath := fs.String("key", "", "cosign private key (cosign generate-key-pair)")
	ref := fs.String("reference", "", "the repository the image is published as; the signature claims <reference>@<digest>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" || *keyPath == "" || *ref == "" {
		return errors.New("--layout, --out, --key and --reference are required")
	}
	if _, err := os.Stat(*out); err == nil {
		return fmt.Errorf("--out %s exists; remove it first", *out)
	}

	index, err := onlyIndex(*in)
	if err != nil {
		return err
	}
	digest, err := index.Digest()
	if err != nil {
		return fmt.Errorf("digest of the image index: %w", err)
	}
	repo, err := name.NewRepository(*ref)
	if err != nil {
		return fmt.Errorf("--reference %q: %w", *ref, err)
	}

	key, err := os.ReadFile(*keyPath)
	if err != nil {
		return fmt.Errorf("reading --key: %w", err)
	}
	signer, err := cosign.LoadPrivateKey(key, []byte(os.Getenv("COSIGN_PASSWORD")), nil)
	if err != nil {
		return fmt.Errorf("loading --key %s (is COSIGN_PASSWORD its password?): %w", *keyPath, err)
	}
	// The payload cosign sign signs: the simple-signing document naming the
	// image by digest.
	body, err := payload.Cosign{Image: repo.Digest(digest.String())}.MarshalJSON()
	if err != nil {
		return fmt.Errorf("signature payload: %w", err)
	}
	sig, err := signer.SignMessage(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("signing: %w", err)
	}
	ociSig, err := static.NewSignature(body, base64.StdEncoding.EncodeToString(sig))
	if err != nil {
		return fmt.Errorf("signature layer: %w", err)
	}
	signedIndex, err := mutate.AttachSignatureToImageIndex(signed.ImageIndex(index), ociSig)
	if err != nil {
		return fmt.Errorf("attaching the signature: %w", err)
	}
	if err := layout.WriteSignedImageIndex(*out, signedIndex); err != nil {
		return fmt.Errorf("writing %s: %w", *out, err)
	}
	fmt.Println(digest.String())
	return nil
}

// onlyIndex returns the one image index a layout's index.json points at.
func onlyIndex(dir string) (v1.ImageIndex, error) {
	p, err := gcrlayout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("--layout %s: %w", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("--layout %s: %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("--layout %s: %w", dir, err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("--layout %s: want exactly one image index in index.json, found %d entries", dir, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}
