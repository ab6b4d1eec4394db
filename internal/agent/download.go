package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// installRunner puts the runner into install: downloaded, checked and
// unpacked when downloadURL is set, else checked to be there. scripts are
// the runner's scripts that must be there.
func (a *agent) installRunner(ctx context.Context, sw *agentconfig.Software, install string, scripts []string) error {
	if sw.DownloadURL == "" {
		for _, script := range scripts {
			p := filepath.Join(install, script)
			fi, err := os.Stat(p)
			if err != nil {
				return fail(ExitRunnerSoftware, "no runner in installPath and no downloadURL to fetch one: %v", err)
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
				return fail(ExitRunnerSoftware, "runner script %s is not an executable file (mode %s)", p, fi.Mode())
			}
		}
		a.log.Info("using the runner installed in the image", "installPath", install)
		return nil
	}

	pkg, err := a.download(ctx, sw.DownloadURL, sw.DownloadSHA256)
	if err != nil {
		return err
	}
	defer a.removeDownload(pkg, "package")
	format, err := archiveFormat(sw.DownloadURL, pkg)
	if err != nil {
		return fail(ExitRunnerSoftware, "runner package: %v", err)
	}
	if err := a.emptyInstall(install); err != nil {
		return err
	}
	n, err := unpack(pkg, format, install, unpackLimits{bytes: a.opts.MaxUnpackedBytes, entries: a.opts.MaxUnpackedFiles})
	if err != nil {
		return fail(ExitRunnerSoftware, "unpack the runner package: %v", err)
	}
	a.log.Info("runner package unpacked", "installPath", install, "format", format, "entries", n)
	for _, script := range scripts {
		if fi, err := os.Stat(filepath.Join(install, script)); err != nil || !fi.Mode().IsRegular() {
			return fail(ExitRunnerSoftware, "the runner package has no script %s", script)
		}
	}
	return nil
}

// installBinary installs a runner published as one bare executable (GitLab's
// gitlab-runner downloads): without a downloadURL it checks that
// install/name is an executable file, else it downloads the binary,
// checks its SHA-256 and copies it to install/name (mode 0755) in an
// emptied installPath, which the agent removes at the end as it does an
// unpacked package.
func (a *agent) installBinary(ctx context.Context, sw *agentconfig.Software, install, name string) error {
	if sw.DownloadURL == "" {
		return a.installRunner(ctx, sw, install, []string{name})
	}
	pkg, err := a.download(ctx, sw.DownloadURL, sw.DownloadSHA256)
	if err != nil {
		return err
	}
	defer a.removeDownload(pkg, "binary")
	if err := a.emptyInstall(install); err != nil {
		return err
	}
	if err := copyExecutable(pkg, filepath.Join(install, name)); err != nil {
		return fail(ExitRunnerSoftware, "install the runner binary: %v", err)
	}
	a.log.Info("runner binary installed", "path", filepath.Join(install, name))
	return nil
}

// removeDownload removes the downloaded file pkg once installed (what
// names it in the log: package or binary).
func (a *agent) removeDownload(pkg, what string) {
	if err := os.Remove(pkg); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Error("cannot remove the downloaded "+what, "path", pkg, "error", err)
	}
}

// emptyInstall makes install an empty directory for a downloaded runner.
// From then on the install directory is ours to remove at the end.
func (a *agent) emptyInstall(install string) error {
	a.removeInstall = true
	if err := os.RemoveAll(install); err != nil {
		return fail(ExitRunnerSoftware, "clear installPath %s: %v", install, err)
	}
	if err := os.MkdirAll(install, 0o755); err != nil {
		return fail(ExitRunnerSoftware, "create installPath %s: %v", install, err)
	}
	return nil
}

// copyExecutable copies the file src to the new file dst, mode 0755.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// download fetches rawURL into a temporary file while hashing it and
// returns the file's path once it matches wantSHA256 (checked when given).
func (a *agent) download(ctx context.Context, rawURL, wantSHA256 string) (path string, err error) {
	shown := safeURL(rawURL)
	client := a.opts.HTTPClient
	if client == nil {
		if client, err = defaultHTTPClient(a.proxy); err != nil {
			return "", fail(ExitInternal, "HTTP client: %v", err)
		}
		defer client.CloseIdleConnections()
	}
	dctx := ctx
	if a.opts.DownloadTimeout > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, a.opts.DownloadTimeout)
		defer cancel()
	}
	downloadErr := func(err error) error {
		if ctx.Err() != nil {
			return fail(ExitInternal, "download of %s interrupted: %v", shown, ctx.Err())
		}
		if errors.Is(dctx.Err(), context.DeadlineExceeded) {
			return fail(ExitRunnerSoftware, "download of %s did not finish within --download-timeout %s", shown, a.opts.DownloadTimeout)
		}
		return fail(ExitRunnerSoftware, "download %s: %v", shown, err)
	}

	a.log.Info("downloading the runner package", "url", shown)
	start := time.Now()
	req, err := http.NewRequestWithContext(dctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return "", fail(ExitRunnerSoftware, "download %s: %v", shown, err)
	}
	req.Header.Set("User-Agent", "hyperfleet-agent/"+a.opts.Version)
	resp, err := client.Do(req)
	if err != nil {
		return "", downloadErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fail(ExitRunnerSoftware, "download %s: HTTP %d: %s", shown, resp.StatusCode, strings.TrimSpace(string(body)))
	}

	limit := a.opts.MaxDownloadBytes
	if resp.ContentLength > limit {
		return "", fail(ExitRunnerSoftware, "download %s: the package has %d bytes, more than the agent's bound of %d (--max-download-bytes); refusing it", shown, resp.ContentLength, limit)
	}
	f, err := os.CreateTemp(a.opts.TempDir, "hyperfleet-runner-*.pkg")
	if err != nil {
		return "", fail(ExitInternal, "temporary file for the runner package: %v", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	// One byte more than the bound tells a package that exceeds it.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return "", downloadErr(err)
	}
	if n > limit {
		err = fail(ExitRunnerSoftware, "download %s: the package is larger than the agent's bound of %d bytes (--max-download-bytes); refusing it", shown, limit)
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", fail(ExitInternal, "write the runner package: %v", err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	switch {
	case wantSHA256 == "":
		a.log.Warn("runner package not verified: no downloadSHA256 in the config", "url", shown, "sha256", got)
	case !strings.EqualFold(got, wantSHA256):
		err = fail(ExitRunnerSoftware, "runner package %s does not match its checksum: downloadSHA256 is %s but the download has SHA-256 %s; refusing it", shown, wantSHA256, got)
		return "", err
	default:
		a.log.Info("runner package verified", "sha256", got)
	}
	a.log.Info("runner package downloaded", "bytes", n, "took", time.Since(start).Round(time.Millisecond))
	return f.Name(), nil
}

// defaultHTTPClient trusts the system roots plus the PEM file named by
// SSL_CERT_FILE, read now: Go's own system pool reads SSL_CERT_FILE only
// once per process, which would not see a change of it (tests).
func defaultHTTPClient(proxy *agentconfig.Proxy) (*http.Client, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if file := os.Getenv("SSL_CERT_FILE"); file != "" {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("SSL_CERT_FILE: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("SSL_CERT_FILE %s holds no PEM certificate", file)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = proxy.Func()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// safeURL is rawURL without credentials, query or fragment, for logs
// (a pre-signed URL carries its signature in the query).
func safeURL(rawURL string) string {
	if rawURL == "" {
		return ""
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}
