package localcluster

// APIServer is the running kube-apiserver process, nil while it is stopped;
// benchmarks read its CPU time.
func (cp *ControlPlane) APIServer() *Process { return cp.apiserver }

// Etcd is the running etcd process.
func (cp *ControlPlane) Etcd() *Process { return cp.etcd }
