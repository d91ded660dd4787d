package runner

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/firewall"
)

// Settings are the typed settings of one run of a sandbox's nether. The
// zero value of a field leaves nether's default. The control socket (and
// the data socket, with AppPort) are the launch directory's own (layout).
type Settings struct {
	SandboxID, Hostname string
	CPUs, RAMMB         int
	Net                 bool
	// NetAllow and NetBlock are comma-separated CIDR lists.
	NetAllow, NetBlock                 string
	GPU                                bool
	MaxRuntimeS, MaxCPUS, IdleTimeoutS int64
	AppPort, EgressPort                int
	// Rootfs is "" (the default image), RootfsBusybox, or the absolute
	// path of a root image.
	Rootfs string
	RunAs  string
	// Disk is the persistent disk's host file ("" none); DiskSizeMB the
	// size a new one gets.
	Disk       string
	DiskSizeMB int
	// RestoreFrom is the artifact a restore starts from ("" boots).
	RestoreFrom string
	// The boot's identity, from an orchestrator that admitted it.
	NodeID, BootID, PlanDigest, IdentityToken string
}

// Defaults are the settings nether runs with where Settings leave a
// field zero.
var Defaults = func() Settings {
	d := conf.Defaults("")
	return Settings{CPUs: d.CPUs, RAMMB: d.RAMMB, DiskSizeMB: d.DiskSizeMB}
}()

// SettingError is a setting nether refuses: it names the setting and its
// value, then says what nether said.
type SettingError struct {
	Key, Value string
	Err        error
}

func (e *SettingError) Error() string {
	var ce *conf.Error
	if errors.As(e.Err, &ce) && ce.Msg != "" {
		return fmt.Sprintf("%s %s: %s", e.Key, e.Value, ce.Msg)
	}
	return fmt.Sprintf("%s %s: %v", e.Key, e.Value, e.Err)
}

func (e *SettingError) Unwrap() error { return e.Err }

// Check refuses settings nether would refuse, naming the setting, by
// nether's own rules (the same check Text makes). Paths are checked where
// they are: a root image must exist.
func (s Settings) Check() error {
	_, err := s.Text(os.TempDir(), false)
	return err
}

// Text is the nether.conf of a run in the launch directory dir: s as
// nether's canonical writer renders it, validated by nether's parser in
// dir. withSecrets adds secrets_fd, the first inherited descriptor.
func (s Settings) Text(dir string, withSecrets bool) (string, error) {
	c, err := s.config(dir, withSecrets)
	if err != nil {
		return "", err
	}
	text := c.Format()
	if _, err := conf.Parse(strings.NewReader(text), ConfFile, dir); err != nil {
		var ce *conf.Error
		if errors.As(err, &ce) && ce.Key != "" {
			return "", &SettingError{Key: ce.Key, Value: reported(c, ce.Key), Err: err}
		}
		return "", err
	}
	return text, nil
}

// reported is key's value in c as nether reports it.
func reported(c *conf.Config, key string) string {
	for _, kv := range c.Report() {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// config is s as nether's Config for dir, refusing a value that one line
// of nether.conf cannot carry.
func (s Settings) config(dir string, withSecrets bool) (*conf.Config, error) {
	for _, kv := range []struct{ key, v string }{{conf.KeyNetAllow, s.NetAllow}, {conf.KeyNetBlock, s.NetBlock},
		{conf.KeyRootfs, s.Rootfs}, {conf.KeyRunAs, s.RunAs}, {conf.KeySandboxID, s.SandboxID}, {conf.KeyHostname, s.Hostname},
		{conf.KeyDisk, s.Disk}, {conf.KeyRestoreFrom, s.RestoreFrom}, {conf.KeyNodeID, s.NodeID}, {conf.KeyBootID, s.BootID},
		{conf.KeyPlanDigest, s.PlanDigest}, {conf.KeyIdentityToken, s.IdentityToken}} {
		if err := oneLine(kv.key, kv.v); err != nil {
			return nil, err
		}
	}
	if s.Rootfs != "" && s.Rootfs != RootfsBusybox && !filepath.IsAbs(s.Rootfs) {
		return nil, fmt.Errorf("%s %q: want an absolute path of a root image, or busybox (nether runs in the sandbox's own directory, where a relative path means nothing)", conf.KeyRootfs, s.Rootfs)
	}
	c := conf.Defaults(dir)
	c.ControlSocket = filepath.Join(c.Dir, ControlSocket)
	c.SandboxID, c.Hostname = s.SandboxID, s.Hostname
	setInt(&c.CPUs, s.CPUs)
	setInt(&c.RAMMB, s.RAMMB)
	c.Net, c.GPU = s.Net, s.GPU
	var err error
	if c.NetAllow, err = prefixes(conf.KeyNetAllow, s.NetAllow); err != nil {
		return nil, err
	}
	if c.NetBlock, err = prefixes(conf.KeyNetBlock, s.NetBlock); err != nil {
		return nil, err
	}
	c.MaxRuntimeS, c.MaxCPUS, c.IdleTimeoutS = s.MaxRuntimeS, s.MaxCPUS, s.IdleTimeoutS
	if s.AppPort != 0 {
		// The data plane's host end: without a socket the port reaches
		// nothing (nether splices each connection to it to the port).
		c.AppPort, c.DataSocket = s.AppPort, filepath.Join(c.Dir, DataSocket)
	}
	c.EgressPort = s.EgressPort
	c.Rootfs, c.RunAs, c.Disk = s.Rootfs, s.RunAs, s.Disk
	setInt(&c.DiskSizeMB, s.DiskSizeMB)
	if s.RestoreFrom != "" {
		c.Restore, c.RestoreFrom = true, s.RestoreFrom
	}
	c.NodeID, c.BootID, c.PlanDigest, c.IdentityToken = s.NodeID, s.BootID, s.PlanDigest, s.IdentityToken
	if withSecrets {
		c.SecretsFD = 3 // the child's first inherited descriptor (Launch)
	}
	return c, nil
}

func setInt(dst *int, v int) {
	if v != 0 {
		*dst = v
	}
}

// oneLine refuses a value that would not stay one setting on one line of
// nether.conf: nothing in it may end the line or open a comment.
func oneLine(key, v string) error {
	switch {
	case v == "":
		return nil
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return fmt.Errorf("%s %q: contains a control character", key, v)
	case strings.TrimSpace(v) != v:
		return fmt.Errorf("%s %q: has blanks around it", key, v)
	case strings.Contains(v, " #") || strings.Contains(v, "\t#"):
		return fmt.Errorf("%s %q: a # after a blank starts a comment in nether.conf", key, v)
	}
	return nil
}

// prefixes parses a CIDR list setting as nether does.
func prefixes(key, v string) ([]netip.Prefix, error) {
	if v == "" {
		return nil, nil
	}
	ps, err := firewall.ParseList(v)
	if err != nil {
		return nil, &SettingError{Key: key, Value: v, Err: err}
	}
	return ps, nil
}

// CheckHostname refuses a hostname nether would refuse.
func CheckHostname(h string) error { return conf.CheckHostname(h) }

// CheckSecrets refuses a set of secrets nether would refuse (names,
// count, size), before anything starts.
func CheckSecrets(secrets map[string][]byte) error { return agentproto.CheckSecrets(secrets) }

// SecretNames are the names of secrets, sorted.
func SecretNames(secrets map[string][]byte) []string { return agentproto.SecretNames(secrets) }

// EncodeSecrets is secrets as nether reads them from secrets_fd.
func EncodeSecrets(secrets map[string][]byte) []byte { return agentproto.EncodeSecrets(secrets) }
