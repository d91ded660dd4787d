package conf

// The keys of nether.conf that an orchestrator writes, by name: the one
// place their spelling lives. The fields table below uses them, and so do
// the runner's typed settings and the messages that name a setting.
const (
	KeyControlSocket = "control_socket"
	KeyCPUs          = "cpus"
	KeyRAMMB         = "ram_mb"
	KeyMaxRuntimeS   = "max_runtime_s"
	KeyMaxCPUS       = "max_cpu_s"
	KeyIdleTimeoutS  = "idle_timeout_s"
	KeyRootfs        = "rootfs"
	KeyRunAs         = "run_as"
	KeyDisk          = "disk"
	KeyDiskSizeMB    = "disk_size_mb"
	KeyRestore       = "restore"
	KeyRestoreFrom   = "restore_from"
	KeySandboxID     = "sandbox_id"
	KeyHostname      = "hostname"
	KeyGPU           = "gpu"
	KeyNet           = "net"
	KeyNetAllow      = "net_allow"
	KeyNetBlock      = "net_block"
	KeyAppPort       = "app_port"
	KeyDataSocket    = "data_socket"
	KeyEgressPort    = "egress_port"
	KeyNodeID        = "node_id"
	KeyBootID        = "boot_id"
	KeyPlanDigest    = "plan_digest"
	KeyIdentityToken = "identity_token"
	KeySecretsFD     = "secrets_fd"
)
