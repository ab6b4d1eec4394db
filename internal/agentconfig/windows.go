package agentconfig

import "strings"

// Where things are in a Windows VM (runner.software.os win; docs/windows.md).
// The cloudbase-init user data writes the config and installs the
// service; the operator places the secrets through the QEMU guest agent,
// which on Windows takes Windows paths.
const (
	// WindowsDir is the agent's own directory: config, secrets, log.
	WindowsDir = `C:\ProgramData\HyperFleet`
	// WindowsPath is the agent's config in a Windows VM (Path's
	// counterpart), which cmd/hyperfleet-agent reads by default there.
	WindowsPath = WindowsDir + `\agent.json`
	// WindowsLogPath is where the agent's service writes its log.
	WindowsLogPath = WindowsDir + `\agent.log`
	// WindowsSecretsDir is SecretsDir's counterpart: the user data makes
	// it with an access list of SYSTEM and Administrators only, inherited
	// by the file the guest agent creates in it.
	WindowsSecretsDir = WindowsDir + `\secrets`
	// WindowsSecretsFile is SecretsFile's counterpart.
	WindowsSecretsFile = WindowsSecretsDir + `\secrets.json`
	// WindowsAgentBinary is where a Windows image has the agent.
	WindowsAgentBinary = `C:\Program Files\HyperFleet\hyperfleet-agent.exe`
)

// SecretsFileFor is where the operator places the secrets of a VM whose
// runner software is for os (GitHub's naming: linux, win).
func SecretsFileFor(os string) string {
	if os == "win" {
		return WindowsSecretsFile
	}
	return SecretsFile
}

// WindowsPathOf is a template's Linux-style runner path on a Windows VM:
// the same directories on the system drive, /opt/actions-runner being
// C:\opt\actions-runner (the API's installPath and workDir are written
// with slashes for every guest; docs/windows.md).
func WindowsPathOf(p string) string {
	return `C:` + strings.ReplaceAll(p, "/", `\`)
}

// IsWindowsAbs says whether p is an absolute Windows path on a drive
// (C:\...), written plainly: no '/', no empty, '.' or '..' element, no
// trailing '\'. Checked here on Linux, where the operator renders it.
func IsWindowsAbs(p string) bool {
	if len(p) < 3 || p[1] != ':' || p[2] != '\\' || p[0] < 'A' || p[0] > 'Z' {
		return false
	}
	if p == p[:3] {
		return true
	}
	if strings.ContainsAny(p, "/\x00") || strings.HasSuffix(p, `\`) {
		return false
	}
	for _, e := range strings.Split(p[3:], `\`) {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	return true
}

// windowsSystemTrees belong to Windows or its programs with everything in
// them; windowsSystemDirs hold other programs' data beside places a runner
// may use, so only they and their parents are refused. Compared without
// case, as Windows does.
var (
	windowsSystemTrees = []string{`C:\Windows`, `C:\Program Files`, `C:\Program Files (x86)`, WindowsDir, `C:\Recovery`, `C:\System Volume Information`, `C:\$Recycle.Bin`}
	windowsSystemDirs  = []string{`C:\ProgramData`, `C:\Users`, `C:\Users\Public`}
)

// CheckWindowsRunnerPath is CheckRunnerPath for a Windows VM: why p may not
// be runner.software.installPath or workDir there, or "".
func CheckWindowsRunnerPath(p string) string {
	if !IsWindowsAbs(p) {
		return `must be an absolute Windows path written plainly, such as C:\actions-runner`
	}
	if len(p) == 3 {
		return "is the root of a drive"
	}
	lp := strings.ToLower(p)
	for _, d := range windowsSystemTrees {
		ld := strings.ToLower(d)
		switch {
		case lp == ld:
			return "is the system directory " + d
		case strings.HasPrefix(lp, ld+`\`):
			return "is inside the system directory " + d
		case strings.HasPrefix(ld, lp+`\`):
			return "contains the system directory " + d
		}
	}
	for _, d := range windowsSystemDirs {
		ld := strings.ToLower(d)
		if lp == ld || strings.HasPrefix(ld, lp+`\`) {
			return "is or contains the system directory " + d
		}
	}
	return ""
}
