package v1alpha1

// Buildkite's part of the API: a template's spec.bootstrap.buildkite, a
// RunnerPool's spec.workload.buildkite and a MachineClaim's
// spec.workloadConfig.buildkite (docs/buildkite.md). They live in a file of
// their own so that each CI platform's section reads in one place.

// BuildkiteBootstrap is the Buildkite organization and cluster a
// template's agents join, and the operator's API token. For each claim the
// operator creates a cluster agent token (POST .../clusters/{id}/tokens)
// that expires soon after, which it keeps, and with it issues the VM's
// buildkite-agent a job acquisition token for the one job the claim is
// bound to; it deletes the cluster token once the agent registered, or
// when the VM goes.
type BuildkiteBootstrap struct {
	// organization is the organization's slug, as in
	// https://buildkite.com/<organization>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Organization string `json:"organization"`

	// cluster is the UUID of the cluster whose queues the agents serve
	// (Organization settings, Clusters; or GET /v2/organizations/<org>/clusters).
	// Required: the per-claim agent tokens are cluster tokens.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	Cluster string `json:"cluster"`

	// apiURL is Buildkite's REST API, without /v2.
	// +optional
	// +kubebuilder:default="https://api.buildkite.com"
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && !self.endsWith('/')",message="bootstrap.buildkite.apiURL must be an https:// URL without a trailing /, such as https://api.buildkite.com"
	APIURL string `json:"apiURL,omitempty"`

	// agentEndpoint is the agent API the VMs' buildkite-agent talks to (its
	// --endpoint).
	// +optional
	// +kubebuilder:default="https://agent.buildkite.com/v3"
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && !self.endsWith('/')",message="bootstrap.buildkite.agentEndpoint must be an https:// URL without a trailing /, such as https://agent.buildkite.com/v3"
	AgentEndpoint string `json:"agentEndpoint,omitempty"`

	// credentials are the operator's Buildkite API token, as a Secret key in
	// this namespace. It never reaches a VM.
	// +required
	Credentials BuildkiteCredentials `json:"credentials"`

	// agent says where the buildkite-agent binary comes from and where jobs
	// run inside the VM.
	// +optional
	Agent *BuildkiteAgentSoftware `json:"agent,omitempty"`
}

// BuildkiteCredentials are the operator's Buildkite API access token.
type BuildkiteCredentials struct {
	// apiToken selects a Buildkite API access token of the organization with
	// the REST scopes read_organizations, read_clusters and write_clusters
	// (the per-claim cluster agent tokens), read_agents and write_agents (agents, and
	// stopping them), read_builds and write_builds (scheduled jobs, and
	// cancelling a build past its limits) (docs/buildkite.md).
	// +required
	APIToken LocalSecretKeySelector `json:"apiToken"`
}

// BuildkiteAgentOS is the VM's operating system in Buildkite's release naming.
// +kubebuilder:validation:Enum=linux
type BuildkiteAgentOS string

// BuildkiteAgentArch is the VM's architecture in Buildkite's release naming.
// +kubebuilder:validation:Enum=amd64;arm64
type BuildkiteAgentArch string

// BuildkiteAgentSoftware is the buildkite-agent binary and where jobs run.
// +kubebuilder:validation:XValidation:rule="!has(self.downloadURL) || has(self.downloadSHA256)",message="bootstrap.buildkite.agent.downloadURL needs bootstrap.buildkite.agent.downloadSHA256: give the archive's SHA-256 (64 hex digits) so that the agent can check the download, or remove downloadURL and install buildkite-agent in the template"
// +kubebuilder:validation:XValidation:rule="has(self.downloadURL) || !has(self.downloadSHA256)",message="bootstrap.buildkite.agent.downloadSHA256 applies only with bootstrap.buildkite.agent.downloadURL: remove it, or set downloadURL"
type BuildkiteAgentSoftware struct {
	// path is the buildkite-agent binary in the VM: installed there in the
	// template (default /usr/local/bin/buildkite-agent), or where the
	// HyperFleet agent puts the binary of downloadURL's archive.
	// +optional
	// +kubebuilder:default="/usr/local/bin/buildkite-agent"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*[^/]$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('//') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..')",message="bootstrap.buildkite.agent.path must be written plainly, without //, /./ or /../"
	Path string `json:"path,omitempty"`

	// downloadURL is a release archive (.tar.gz) with buildkite-agent at its
	// root, such as
	// https://github.com/buildkite/agent/releases/download/v3.138.1/buildkite-agent-{os}-{arch}-3.138.1.tar.gz;
	// {os} and {arch} are replaced by os and arch. Unset means the binary is
	// installed in the template at path.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self.replace('{os}', 'linux').replace('{arch}', 'amd64')) && self.startsWith('https://')",message="bootstrap.buildkite.agent.downloadURL must be an https:// URL; {os} and {arch} may appear in it"
	DownloadURL string `json:"downloadURL,omitempty"`

	// downloadSHA256 is the archive's SHA-256 (64 hex digits, as the
	// release's checksum file lists it); required with downloadURL. The
	// HyperFleet agent refuses a download that does not match.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	DownloadSHA256 string `json:"downloadSHA256,omitempty"`

	// buildPath is where jobs are checked out and run (buildkite-agent's
	// --build-path), emptied after each job. It may not be, contain or lie
	// inside a system directory.
	// +optional
	// +kubebuilder:default="/var/lib/hyperfleet/builds"
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self == '/' || (!self.contains('//') && !self.endsWith('/') && !self.contains('/./') && !self.contains('/../') && !self.endsWith('/.') && !self.endsWith('/..'))",message="bootstrap.buildkite.agent.buildPath must be written plainly, without //, /./, /../ or a trailing /"
	// +kubebuilder:validation:XValidation:rule="self != '/' && (self.startsWith('/usr/local/') ? !['bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src'].exists(d, self == '/usr/local/' + d || self.startsWith('/usr/local/' + d + '/')) : (!['/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/proc', '/root', '/run', '/sbin', '/sys', '/usr'].exists(d, self == d || self.startsWith(d + '/') || d.startsWith(self + '/')) && !['/home', '/media', '/mnt', '/opt', '/srv', '/tmp', '/var', '/var/cache', '/var/lib', '/var/lib/cloud', '/var/log', '/var/tmp'].exists(d, self == d || d.startsWith(self + '/'))))",message="bootstrap.buildkite.agent.buildPath must not be, contain or (for /bin, /boot, /dev, /etc, /lib*, /proc, /root, /run, /sbin, /sys, /usr) lie inside a system directory: the agent empties it as root after each job; use a directory of its own such as /var/lib/hyperfleet/builds (docs/security.md)"
	BuildPath string `json:"buildPath,omitempty"`

	// os is the VM's operating system in Buildkite's release naming; only
	// linux.
	// +optional
	// +kubebuilder:default=linux
	OS BuildkiteAgentOS `json:"os,omitempty"`

	// arch is the VM's architecture in Buildkite's release naming.
	// +optional
	// +kubebuilder:default=amd64
	Arch BuildkiteAgentArch `json:"arch,omitempty"`
}

// BuildkiteWorkload selects the Buildkite jobs a pool serves: the jobs of
// the template's cluster whose agent query rules its agents match (the
// queue, and every other key=value rule among the tags).
type BuildkiteWorkload struct {
	// queue is the cluster queue's key the pool's agents serve (their
	// queue tag).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:-]+$`
	Queue string `json:"queue"`

	// defaultQueue says that queue is the cluster's default queue, where
	// Buildkite sends the jobs whose agent query rules name no queue: the
	// pool then serves those jobs too. Webhooks do not say which queue is
	// the default, so the pool must.
	// +optional
	DefaultQueue bool `json:"defaultQueue,omitempty"`

	// tags are the agents' other tags, as key=value; a job whose agent query
	// rules name other keys than queue is served when each of them is among
	// these.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=3
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+=[^,\s]+$`
	// +kubebuilder:validation:XValidation:rule="self.all(t, !t.startsWith('queue='))",message="workload.buildkite.tags must not set queue: use workload.buildkite.queue"
	// +listType=set
	Tags []string `json:"tags,omitempty"`

	// pipeline, a slug, narrows the pool to that pipeline's jobs; unset for
	// every pipeline of the template's cluster. A pool serves one pipeline or
	// all of them: pools of several pipelines are several pools.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Pipeline string `json:"pipeline,omitempty"`
}

// BuildkiteAgentConfig is one Buildkite agent. Its name on Buildkite is the
// claim's name.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.jobID) || has(self.jobID)",message="workloadConfig.buildkite.jobID cannot be removed: a claim bound to a job stays bound to it for its life (its RunnerPool sets it once, when it makes the claim or binds a warm one)"
type BuildkiteAgentConfig struct {
	// queue is the agent's queue; empty for its pool's.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:-]+$`
	Queue string `json:"queue,omitempty"`

	// tags are the agent's other tags, as key=value; empty for its pool's.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=3
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+=[^,\s]+$`
	// +kubebuilder:validation:XValidation:rule="self.all(t, !t.startsWith('queue='))",message="workloadConfig.buildkite.tags must not set queue: use workloadConfig.buildkite.queue"
	// +listType=set
	Tags []string `json:"tags,omitempty"`

	// jobID is the scheduled Buildkite job (its UUID) the claim is bound
	// to. Written by the claim's RunnerPool only (the admission policy in
	// config/admission refuses anyone else): when it makes a VM for a
	// queued job of the pool, or when a job arrives for a warm VM of the
	// pool that stands by unbound. The VM's agent then gets a job
	// acquisition token good for that job alone, which names the job, and
	// runs `buildkite-agent start --acquire-job <jobID>`. Before it issues
	// the token the operator checks that the job is a queued job of the
	// claim's pool and, on Buildkite, still scheduled in the pool's cluster
	// and queue; otherwise the claim gets no credential (condition
	// Provisioned False, reason JobNotBindable). Unset: the VM waits with no
	// credential (Bootstrapped True, reason WaitingForJob) until its pool
	// binds it a job. Set once: it can be added to a claim that has none,
	// never changed or removed.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="workloadConfig.buildkite.jobID is immutable: a claim is bound to one job for its life"
	JobID string `json:"jobID,omitempty"`
}
