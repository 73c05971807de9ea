package nodecluster

import (
	"fmt"
	"strings"
)

// Network is the addressing inside the cluster's network namespace.
type Network struct {
	// Bridge is the Linux bridge the pods attach to.
	Bridge string
	// Subnet is the pods' and the node's /24 (pods get addresses from it).
	Subnet string
	// NodeIP is the node's address on the bridge and the pods' gateway.
	NodeIP string
	// ServiceCIDR is the Services' range.
	ServiceCIDR string
	// APIServiceIP is the kubernetes Service's ClusterIP (the first address
	// of ServiceCIDR), also put on the bridge.
	APIServiceIP string
}

// DefaultNetwork is private addressing that exists only inside the
// namespace.
var DefaultNetwork = Network{
	Bridge:       "ahb0",
	Subnet:       "10.88.0.0/24",
	NodeIP:       "10.88.0.1",
	ServiceCIDR:  "10.96.0.0/24",
	APIServiceIP: "10.96.0.1",
}

func (n Network) prefixLen() string { return n.Subnet[strings.Index(n.Subnet, "/")+1:] }

// APIServerPort is the API server's port, the kubernetes Service's port:
// pods connect to APIServiceIP:443 and nothing translates it.
const APIServerPort = 443

// containerdConfig keeps every path containerd writes in dir, except the
// shim sockets (containerd 1.6 puts them under /run/containerd/s).
func containerdConfig(dir, pauseImage string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
oom_score = 0

[grpc]
  address = %[3]q

[ttrpc]
  address = ""

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[6]q

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
    max_conf_num = 1
`, dir+"/containerd/root", dir+"/containerd/state", dir+"/containerd/containerd.sock",
		dir+"/containerd/opt", pauseImage, dir+"/containerd/runc", dir+"/cni/net.d")
}

// cniConfig is a bridge network without IP forwarding or masquerading (the
// bridge plugin changes no sysctl and no firewall rule then), with
// host-local addresses kept in dir.
func cniConfig(name, dir string, n Network) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %[1]q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %[2]q,
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %[3]q,
        "ranges": [[{"subnet": %[4]q, "rangeStart": %[5]q, "gateway": %[6]q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, name, n.Bridge, dir+"/cni/ipam", n.Subnet, strings.TrimSuffix(n.NodeIP, ".1")+".10", n.NodeIP)
}

// kubeletConfig is what this VM needs (cgroup v1, no swap accounting, no
// CAP_SYS_RESOURCE) and what keeps the host untouched: no firewall chains,
// kernel settings only checked, every path in dir, a cgroup root of its own.
func kubeletConfig(dir, cgroupRoot, containerdSock string, n Network) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://%[2]s
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[3]q
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: true  # checked against the files of kernelDefaults
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
evictionPressureTransitionPeriod: 5s
podLogsDir: %[4]q
volumePluginDir: %[5]q
resolvConf: %[6]q
clusterDomain: cluster.local
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
syncFrequency: 10s
fileCheckFrequency: 0s
nodeStatusReportFrequency: 10s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[7]q
authorization:
  mode: Webhook
shutdownGracePeriod: 0s
maxPods: 30
`, n.NodeIP, containerdSock, cgroupRoot, dir+"/kubelet/pod-logs", dir+"/kubelet/volume-plugins",
		dir+"/resolv.conf", dir+"/pki/ca.crt")
}
