// Where a process's data plane may listen and send: the network devices
// UCX is given (its NET_DEVICES), so that a job's UCX listeners are bound
// to the network the job runs on rather than to every interface of the
// host. A job on one machine talks over loopback and shared memory only.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace herd::transport {

// UCX_NET_DEVICES for this process: `data_interface` (cluster.data_interface,
// comma-separated network interfaces and RDMA ports such as "eth1" or
// "ib0,mlx5_0:1") when set, each checked to exist on this host; otherwise
// the interface through which this host routes to `coordinator` (HOST:PORT)
// plus the host's RDMA ports, which listen on no IP socket. Empty when the
// environment sets UCX_NET_DEVICES: the operator's choice stands.
StatusOr<std::string> DataPlaneDevices(const std::string& coordinator, const std::string& data_interface);

// UCX's names for the host's RDMA ports: "mlx5_0:1" (none without
// /sys/class/infiniband).
std::vector<std::string> RdmaPorts();

}  // namespace herd::transport
