package cloudinit

import (
	"os"
	"strings"
	"time"
)

// testCA is a throw-away self-signed CA certificate (no key kept anywhere)
// standing in for a SPIRE trust bundle, shared with the agentconfig tests.
var testCA = func() string {
	raw, err := os.ReadFile("../../test/testdata/test-ca.pem")
	if err != nil {
		panic(err)
	}
	return string(raw[strings.Index(string(raw), "-----BEGIN"):])
}()

// baseVars is a DHCP VM with a JIT runner configuration.
func baseVars() Vars {
	return Vars{
		Hostname:             "runner-abc12",
		FQDN:                 "runner-abc12.ci.example.com",
		InstanceID:           "3f0c1a52-6d0e-4e55-9b1c-0d6c2f5b7a10",
		NetworkMode:          NetworkDHCP,
		MACAddress:           "BC:24:11:5E:00:01",
		DHCPClientIdentifier: DHCPIdentifierMAC,
		SendHostname:         true,
		DNSServers:           List{"192.0.2.53"},
		SearchDomains:        List{"ci.example.com"},
		AttestationMethod:    AttestationNone,
		WorkloadMethod:       WorkloadDirect,
		BootstrapMethod:      BootstrapJITConfig,
		RegistrationURL:      "https://github.com/octo-org/octo-repo",
		RunnerName:           "runner-abc12",
		Labels:               List{"self-hosted", "hyperfleet", "linux"},
		SecretsDeadline:      Time{time.Date(2025, 6, 1, 12, 30, 0, 0, time.UTC)},
		RunnerConfig: RunnerConfig{
			InstallPath:  "/opt/actions-runner",
			WorkDir:      "/var/lib/hyperfleet/work",
			ConfigScript: "config.sh",
			RunScript:    "run.sh",
			OS:           "linux",
			Arch:         "x64",
		},
		PowerOffOnFinish: true,
	}
}

func runnerTokenVars(v Vars) Vars {
	v.BootstrapMethod = BootstrapRunnerToken
	v.RunnerGroup = "ci-runners"
	v.RunnerConfig.DownloadURL = "https://github.com/actions/runner/releases/download/v2.329.0/actions-runner-linux-x64-2.329.0.tar.gz"
	v.RunnerConfig.DownloadSHA256 = "194f1e1e4bd02f80b7e9633fc546084d8d4e19f3928a324d512ea53430102e1d"
	return v
}

func spiffeVars(v Vars) Vars {
	v.SPIFFEEnabled = true
	v.AttestationMethod = AttestationJoinToken
	v.WorkloadMethod = WorkloadBroker
	v.ExpiresAt = Time{time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC)}
	v.SPIFFEID = "spiffe://hyperfleet.io/vm/ci/runner-abc12/3f0c1a52-6d0e-4e55-9b1c-0d6c2f5b7a10"
	v.TrustDomain = "hyperfleet.io"
	v.TrustBundle = testCA
	v.SPIREServerAddress = "spire-server.hyperfleet-system.svc:8081"
	v.BrokerURL = "https://broker.hyperfleet.example.com:8443"
	return v
}

// testAgentSHA256 is the SHA-256 of "stand-in for hyperfleet-agent-linux-amd64".
const testAgentSHA256 = "d764619d39f3284005f00aaaccfc62610e008e64fa4e95859dd91666af200999"

// operatorAgentVars takes the agent from the operator's agent server
// (spec.bootstrap.agentSource Operator), as the controller fills it.
func operatorAgentVars(v Vars) Vars {
	base := "https://hyperfleet-agent.hyperfleet-system.svc:9443/agent/v1"
	v.AgentDownloadURL = base + "/hyperfleet-agent-linux-amd64?sha256=" + testAgentSHA256
	v.AgentSHA256 = testAgentSHA256
	v.AgentCA = testCA
	v.BootstrapServiceURL = base
	return v
}

// goldenCase is one rendered seed checked against testdata/<name>/ and
// validated by cloud-init.
type goldenCase struct {
	name string
	in   Input
	// networkd are lines the systemd-networkd files cloud-init renders from
	// the network-config must contain.
	networkd []string
	// userParts are the MIME types cloud-init must find in user-data.
	userParts []string
}

func goldenCases() []goldenCase {
	var cases []goldenCase

	cases = append(cases, goldenCase{
		name:      "dhcp-mac-jit-config",
		in:        Input{Vars: baseVars()},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "Name=eth0", "DHCP=ipv4", "SendHostname=True", "Hostname=runner-abc12", "DNS=192.0.2.53", "Domains=ci.example.com"},
		userParts: []string{"text/cloud-config"},
	})

	v := runnerTokenVars(baseVars())
	v.DHCPClientIdentifier = DHCPIdentifierHostname
	v.IPv6 = true
	cases = append(cases, goldenCase{
		name:      "dhcp-hostname-ipv6-runner-token",
		in:        Input{Vars: v},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "DHCP=yes", "SendHostname=True", "Hostname=runner-abc12"},
		userParts: []string{"text/cloud-config"},
	})

	// requestStaticLease and leaseTime: the host name as client identifier
	// and host name, and the lease time, all in the one bootcmd entry.
	v = baseVars()
	v.DHCPClientIdentifier = DHCPIdentifierHostname
	v.RequestStaticLease = true
	v.DHCPLeaseSeconds = 1800
	cases = append(cases, goldenCase{
		name:      "dhcp-static-lease",
		in:        Input{Vars: v},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "DHCP=ipv4", "SendHostname=True", "Hostname=runner-abc12"},
		userParts: []string{"text/cloud-config"},
	})

	v = runnerTokenVars(baseVars())
	v.NetworkMode = NetworkStatic
	v.DHCPClientIdentifier = ""
	v.SendHostname = false
	// All digits: YAML 1.1 would read it as a base-60 integer if unquoted.
	v.MACAddress = "52:54:00:12:34:56"
	v.StaticIP = "192.0.2.10"
	v.NetmaskBits = 24
	v.Gateway = "192.0.2.1"
	v.DNSServers = List{"192.0.2.53", "192.0.2.54"}
	cases = append(cases, goldenCase{
		name:      "static-ipv4",
		in:        Input{Vars: v},
		networkd:  []string{"MACAddress=52:54:00:12:34:56", "Address=192.0.2.10/24", "Gateway=192.0.2.1", "DNS=192.0.2.53 192.0.2.54", "DHCP=no"},
		userParts: []string{"text/cloud-config"},
	})

	// A proxy, with the agent from the operator: the proxy files, the
	// agent's proxy with the operator's endpoints and the static subnet
	// direct, and curl given the proxy in runcmd.
	v = operatorAgentVars(runnerTokenVars(baseVars()))
	v.NetworkMode = NetworkStatic
	v.DHCPClientIdentifier = ""
	v.SendHostname = false
	v.StaticIP = "192.0.2.10"
	v.NetmaskBits = 24
	v.Gateway = "192.0.2.1"
	proxyVars(&v)
	cases = append(cases, goldenCase{
		name:      "proxy-static-operator-agent",
		in:        Input{Vars: v},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "Address=192.0.2.10/24", "Gateway=192.0.2.1", "DHCP=no"},
		userParts: []string{"text/cloud-config"},
	})

	v = baseVars()
	v.NetworkMode = NetworkStatic
	v.SendHostname = false
	v.DHCPClientIdentifier = ""
	v.StaticIP = "2001:db8:0:1::10"
	v.NetmaskBits = 64
	v.Gateway = "2001:db8:0:1::1"
	v.DNSServers = List{"2001:db8::53"}
	cases = append(cases, goldenCase{
		name:      "static-ipv6",
		in:        Input{Vars: v},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "Address=2001:db8:0:1::10/64", "Gateway=2001:db8:0:1::1", "DNS=2001:db8::53"},
		userParts: []string{"text/cloud-config"},
	})

	// Dual stack: an address from an IPv4 and an IPv6 pool on one NIC,
	// each family with its gateway.
	v = baseVars()
	v.DHCPClientIdentifier = ""
	v.SendHostname = false
	dualStack(&v)
	v.DNSServers = List{"192.0.2.53", "2001:db8::53"}
	cases = append(cases, goldenCase{
		name: "static-dual-stack",
		in:   Input{Vars: v},
		networkd: []string{"MACAddress=bc:24:11:5e:00:01", "Address=192.0.2.10/24", "Address=2001:db8::10/64",
			"Gateway=192.0.2.1", "Gateway=2001:db8::1", "DNS=192.0.2.53 2001:db8::53", "DHCP=no"},
		userParts: []string{"text/cloud-config"},
	})

	v = baseVars()
	v.NetworkMode = NetworkCloudInit
	v.DHCPClientIdentifier = ""
	cases = append(cases, goldenCase{
		name: "cloud-init-network",
		in: Input{
			Vars: v,
			NetworkData: `version: 2
ethernets:
  nic0:
    match:
      macaddress: {{ quote (lower .MACAddress) }}
    set-name: nic0
    dhcp4: true
    dhcp4-overrides:
      send-hostname: true
      hostname: {{ quote .Hostname }}
    nameservers:
      addresses: {{ .DNSServers }}
      search: {{ .SearchDomains }}
vlans:
  nic0.42:
    id: 42
    link: nic0
    addresses:
      - 198.51.100.7/24
`,
			MetaData: `availability-zone: lab-1
runner-labels: {{ toJson .Labels }}
`,
		},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "Name=nic0", "DHCP=ipv4", "Name=nic0.42", "Address=198.51.100.7/24"},
		userParts: []string{"text/cloud-config"},
	})

	cases = append(cases, goldenCase{
		name:      "spiffe-join-token",
		in:        Input{Vars: spiffeVars(baseVars())},
		networkd:  []string{"MACAddress=bc:24:11:5e:00:01", "DHCP=ipv4"},
		userParts: []string{"text/cloud-config"},
	})

	v = spiffeVars(runnerTokenVars(baseVars()))
	v.AttestationMethod = AttestationTPM
	v.TPMDevicePath = "/dev/tpmrm0"
	cases = append(cases, goldenCase{
		name:      "spiffe-tpm-runner-token",
		in:        Input{Vars: v},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/cloud-config"},
	})

	cases = append(cases, goldenCase{
		name: "user-script-multipart",
		in: Input{Vars: baseVars(), UserData: `#!/bin/bash
# Runs before the agent: cloud-init runs user scripts in its final stage,
# and the agent's unit is ordered after that stage.
set -euo pipefail
echo {{ quote .Hostname }} > /etc/hyperfleet-host
apt-get install -y jq
`},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/x-shellscript", "text/cloud-config"},
	})

	cases = append(cases, goldenCase{
		name:      "user-cloud-config-merge",
		in:        Input{Vars: baseVars(), UserData: mergeUserData},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/cloud-config"},
	})

	cases = append(cases, goldenCase{
		name:      "user-mime-multipart",
		in:        Input{Vars: runnerTokenVars(baseVars()), UserData: mimeUserData},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/cloud-config", "text/x-shellscript", "text/cloud-config"},
	})

	cases = append(cases, goldenCase{
		name:      "agent-from-operator",
		in:        Input{Vars: operatorAgentVars(baseVars())},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/cloud-config"},
	})

	// An arm64 runner, the system roots (no CA), and a user script: the
	// operator's part, download first, comes after the user's.
	v = operatorAgentVars(runnerTokenVars(baseVars()))
	v.RunnerConfig.Arch = "arm64"
	v.RunnerConfig.DownloadURL = "https://github.com/actions/runner/releases/download/v2.329.0/actions-runner-linux-arm64-2.329.0.tar.gz"
	v.AgentDownloadURL = "https://agents.ci.example.com/agent/v1/hyperfleet-agent-linux-arm64?sha256=" + testAgentSHA256
	v.AgentCA = ""
	v.BootstrapServiceURL = "https://agents.ci.example.com/agent/v1"
	cases = append(cases, goldenCase{
		name: "agent-from-operator-user-script",
		in: Input{Vars: v, UserData: `#!/bin/sh
echo "runner {{ .RunnerName }} takes its agent from {{ .BootstrapServiceURL }}" > /etc/motd
`},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/x-shellscript", "text/cloud-config"},
	})

	v = runnerTokenVars(baseVars())
	v.BootstrapServiceBinary = NewBytes([]byte("\x7fELF stand-in for the agent binary\n"))
	v.BootstrapServiceURL = "https://hyperfleet.example.com/agent"
	cases = append(cases, goldenCase{
		name:      "seed-000-templates",
		in:        Input{Vars: v, UserData: seedUserData},
		networkd:  []string{"DHCP=ipv4"},
		userParts: []string{"text/cloud-config"},
	})
	return cases
}

// mergeUserData exercises every merge rule: lists concatenated (write_files,
// runcmd, bootcmd, packages, ssh_authorized_keys), a default the user
// overrides (manage_etc_hosts), keys only the user sets, comments, and the
// template functions.
const mergeUserData = `#cloud-config
# Platform team's base configuration.
package_update: true
packages:
  - docker.io
  - git
manage_etc_hosts: localhost
users:
  - default
  - name: ci
    groups: [docker]
    shell: /bin/bash
    lock_passwd: true
ssh_authorized_keys:
  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHyperFleetTestKeyOnlyxxxxxxxxxxxxxxxxxxxx ops@example.com
bootcmd:
  - [sh, -c, "echo booting {{ .Hostname }} > /run/hf-boot"]
write_files:
  - path: /etc/hyperfleet/network.conf
    permissions: '0644'
    content: |
      HOSTNAME={{ .Hostname }}
      FQDN={{ .FQDN }}
      NETWORK_MODE={{ .NetworkMode }}
      LABELS={{ join .Labels "," }}
  - path: /etc/hyperfleet/labels.json
    content: {{ toJson .Labels | quote }}
  - path: /etc/motd
    encoding: b64
    content: {{ base64 (printf "Runner %s\n" .RunnerName) }}
runcmd:
  - systemctl enable --now docker
  - [sh, -c, {{ quote (printf "echo %s ready" .Hostname) }}]
`

const mimeUserData = `Content-Type: multipart/mixed; boundary="USERBOUNDARY"
MIME-Version: 1.0

--USERBOUNDARY
Content-Type: text/cloud-config; charset="us-ascii"
Content-Disposition: attachment; filename="base.cfg"

#cloud-config
packages: [git]
runcmd:
  - echo from the user's cloud-config part

--USERBOUNDARY
Content-Type: text/x-shellscript; charset="us-ascii"
Content-Disposition: attachment; filename="prepare.sh"

#!/bin/sh
echo {{ .RunnerName }} > /etc/runner-name

--USERBOUNDARY--
`

// seedUserData joins userData templates of the kinds users bring (a
// HypervisorMachineTemplate example, a template that downloads the agent
// itself at boot, and a network example) to show that every variable and
// function they use renders.
const seedUserData = `#cloud-config
packages:
  - docker.io
  - git
  - curl
  - jq

write_files:
  - path: /etc/hyperfleet/runner-config.json
    content: |
      {
        "method": "{{ .WorkloadMethod }}",
        "platform": "github-actions",
        {{ if .SPIFFEEnabled }}
        "spiffe": {
          "enabled": true,
          "spiffe_id": "{{ .SPIFFEID }}"
        },
        {{ end }}
        {{ if eq .BootstrapMethod "runner-token" }}
        "secrets_file": "/run/hyperfleet/secrets.json",
        "registration_url": "{{ .RegistrationURL }}",
        "runner_name": "{{ .RunnerName }}",
        "labels": {{ .Labels | toJson }},
        "expires_at": "{{ .ExpiresAt }}",
        "runner": {
          "download_url": "{{ .RunnerConfig.DownloadUrl }}",
          "install_path": "{{ .RunnerConfig.InstallPath }}",
          "work_dir": "{{ .RunnerConfig.WorkDir }}",
          "config_script": "{{ .RunnerConfig.ConfigScript }}",
          "run_script": "{{ .RunnerConfig.RunScript }}",
          "os": "{{ .RunnerConfig.OS }}",
          "arch": "{{ .RunnerConfig.Arch }}"
        }
        {{ end }}
      }
    permissions: '0600'

  # Bootstrap service binary (pre-built and embedded in template)
  - path: /opt/hyperfleet/bootstrap-service
    content: {{ .BootstrapServiceBinary | base64 }}
    permissions: '0755'
    encoding: base64

  - path: /opt/hyperfleet/download-bootstrap.sh
    content: |
      #!/bin/bash
      curl -L -o /opt/hyperfleet/bootstrap-service \
        "{{ .BootstrapServiceURL }}/bootstrap-service-linux-amd64"
    permissions: '0755'

  - path: /etc/hyperfleet/network.conf
    content: |
      HOSTNAME={{ .Hostname }}
      FQDN={{ .FQDN }}
      NETWORK_MODE={{ .NetworkMode }}
    permissions: '0644'

  - path: /etc/systemd/system/hyperfleet-bootstrap.service
    content: |
      [Unit]
      Description=HyperFleet VM Bootstrap Service
      After=network-online.target
      Wants=network-online.target

      [Service]
      Type=exec
      ExecStart=/opt/hyperfleet/bootstrap-service --config /etc/hyperfleet/runner-config.json
      Restart=no
      User=root

      [Install]
      WantedBy=multi-user.target
    permissions: '0644'

runcmd:
  - systemctl daemon-reload
  - systemctl enable hyperfleet-bootstrap.service
  - systemctl start hyperfleet-bootstrap.service
`

// proxyVars gives v the proxy of docs/templates.md's example.
func proxyVars(v *Vars) {
	v.HTTPProxy = "http://proxy.example.com:3128"
	v.HTTPSProxy = "http://proxy.example.com:3128"
	v.NoProxy = List{".example.com", "10.0.0.0/8"}
}
