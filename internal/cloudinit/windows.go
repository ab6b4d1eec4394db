package cloudinit

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Guest operating systems (Vars.GuestOS), as in spec.guest.os.
const (
	GuestLinux   = "linux"
	GuestWindows = "windows"
)

// WindowsServiceName is the Windows service the agent runs as
// (cmd/hyperfleet-agent's serviceName).
const WindowsServiceName = "hyperfleet-agent"

// windowsBoundary separates the parts of a Windows VM's user data. Fixed,
// so that a template's user data is the same bytes for every render (the
// drift hash); no part contains it (checked when rendering).
const windowsBoundary = "hyperfleet-windows-user-data"

// checkWindows refuses Vars the Windows path does not build (the API's
// CEL rules on spec.guest refuse the same templates, docs/windows.md).
func (v *Vars) checkWindows(in Input) error {
	spec, _ := v.platformSpec()
	switch {
	case !spec.Windows:
		return fmt.Errorf("vars: GuestOS windows runs the runners of platforms whose runner runs on Windows only, not Platform %s", v.Platform)
	case v.WorkloadMethod != WorkloadDirect:
		return fmt.Errorf("vars: GuestOS windows needs WorkloadMethod %s (no attestation), not %q", WorkloadDirect, v.WorkloadMethod)
	case v.SPIFFEEnabled:
		return errors.New("vars: GuestOS windows cannot attest (no spire-agent on Windows)")
	case v.NetworkMode != NetworkDHCP || v.DHCPClientIdentifier == DHCPIdentifierHostname || v.RequestStaticLease || v.DHCPLeaseSeconds > 0 || v.IPv6:
		return errors.New("vars: GuestOS windows takes its address from Windows' DHCP client: NetworkMode dhcp with no client identifier, static lease, lease time or IPv6")
	case v.AgentDownloadURL != "":
		return errors.New("vars: GuestOS windows needs the agent in the image; AgentDownloadURL is not built for it")
	case v.RunnerConfig.OS != "win":
		return fmt.Errorf("vars: GuestOS windows needs RunnerConfig.OS win, not %q", v.RunnerConfig.OS)
	case in.UserData != "" || in.NetworkData != "" || in.MetaData != "":
		return errors.New("vars: GuestOS windows does not merge spec.cloudInit.userData, networkData or metaData")
	}
	return nil
}

// windowsRunnerSoftware is the runner's software as a Windows VM's agent
// sees it: the template's paths on the system drive, and the Windows
// runner package's scripts (config.cmd and run.cmd) for the API's
// defaults (config.sh, run.sh).
func windowsRunnerSoftware(s agentconfig.Software) agentconfig.Software {
	s.InstallPath = agentconfig.WindowsPathOf(s.InstallPath)
	s.WorkDir = agentconfig.WindowsPathOf(s.WorkDir)
	for _, p := range []*string{&s.ConfigScript, &s.RunScript} {
		if base, ok := strings.CutSuffix(*p, ".sh"); ok {
			*p = base + ".cmd"
		}
	}
	return s
}

// windowsUserData is a Windows VM's user data for cloudbase-init: MIME
// multipart (cloudbase-init's UserDataPlugin treats user data as
// multipart when its first header block says "Content-Type: multipart"),
// with
//
//   - a text/cloud-config part: write_files with the agent's config
//     (base64, so that cloudbase-init writes the exact bytes);
//   - a text/x-shellscript part named hyperfleet-agent.ps1, which
//     cloudbase-init's ShellScriptPlugin runs by its .ps1 extension with
//     the 64-bit PowerShell: it makes the secrets directory SYSTEM's and
//     the Administrators' alone, installs the agent's service and starts
//     it once.
//
// The host name comes from meta-data's local-hostname (cloudbase-init's
// SetHostNamePlugin, before user data), never from a set_hostname
// directive, which would ask for a reboot in the middle of the user data.
func windowsUserData(v *Vars) ([]byte, error) {
	js, err := agentConfigFile(v)
	if err != nil {
		return nil, err
	}
	cloudConfig := map[string]any{
		"write_files": []any{map[string]any{
			"path":        agentconfig.WindowsPath,
			"encoding":    "b64",
			"content":     base64.StdEncoding.EncodeToString(js),
			"permissions": "0600",
		}},
	}
	cc, err := yaml.Marshal(cloudConfig)
	if err != nil {
		return nil, err
	}
	cc = append([]byte("#cloud-config\n"), cc...)
	ps := windowsInstallScript(v.PowerOffOnFinish)

	var buf bytes.Buffer
	buf.WriteString("Content-Type: multipart/mixed; boundary=\"" + windowsBoundary + "\"\nMIME-Version: 1.0\n\n")
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(windowsBoundary); err != nil {
		return nil, err
	}
	for _, part := range []struct {
		contentType, filename string
		body                  []byte
	}{
		{"text/cloud-config", "hyperfleet.yaml", cc},
		{"text/x-shellscript", "hyperfleet-agent.ps1", []byte(ps)},
	} {
		if bytes.Contains(part.body, []byte(windowsBoundary)) {
			return nil, fmt.Errorf("the %s part contains the MIME boundary", part.filename)
		}
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", part.contentType+"; charset=\"utf-8\"")
		h.Set("Content-Disposition", "attachment; filename=\""+part.filename+"\"")
		h.Set("Content-Transfer-Encoding", "7bit")
		pw, err := w.CreatePart(h)
		if err != nil {
			return nil, err
		}
		if _, err := pw.Write(part.body); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	// multipart.Writer writes CRLF; cloudbase-init's first-header check
	// splits at "\n\n", which the top-level header above has, and
	// Python's email parser takes either line ending.
	return buf.Bytes(), nil
}

// windowsInstallScript is the PowerShell part. Values it uses are the
// constants above, never template input, so nothing is spliced into code.
// A failure stops the VM when it is to power off on finish (as the Linux
// unit's FailureAction does), so that the operator replaces it.
func windowsInstallScript(powerOff bool) string {
	onFailure := `exit 1`
	if powerOff {
		onFailure = `& shutdown.exe /s /t 0 /f /d p:4:1; exit 1`
	}
	return `#ps1_sysnative
# HyperFleet: install the agent's service and start it once. Written by
# the HyperFleet operator; run by cloudbase-init (docs/windows.md).
$ErrorActionPreference = 'Stop'
$agent = '` + agentconfig.WindowsAgentBinary + `'
$dir = '` + agentconfig.WindowsDir + `'
$secrets = '` + agentconfig.WindowsSecretsDir + `'
try {
    if (-not (Test-Path -LiteralPath $agent -PathType Leaf)) {
        throw "hyperfleet: no agent at $agent; the Windows image must have it"
    }
    New-Item -ItemType Directory -Force -Path $secrets | Out-Null
    # SYSTEM's and the Administrators' alone, before the operator places
    # the runner credential here through the guest agent: the file it
    # creates inherits this list.
    foreach ($d in @($dir, $secrets)) {
        & icacls.exe $d /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' | Out-Null
        if ($LASTEXITCODE -ne 0) { throw "hyperfleet: icacls on $d failed with exit code $LASTEXITCODE" }
    }
    & $agent service install --config '` + agentconfig.WindowsPath + `' --log '` + agentconfig.WindowsLogPath + `'
    if ($LASTEXITCODE -ne 0) { throw "hyperfleet: installing the service failed with exit code $LASTEXITCODE" }
    Start-Service -Name '` + WindowsServiceName + `'
} catch {
    Write-Error $_
    ` + onFailure + `
}
`
}
