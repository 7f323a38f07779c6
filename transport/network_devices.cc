#include "transport/network_devices.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/file_util.h"
#include "common/strings.h"
#include "transport/rendezvous.h"

namespace herd::transport {

std::vector<std::string> RdmaPorts() {
  auto names = [](const std::string& dir) {
    StatusOr<std::vector<std::string>> listed = ListDirectory(dir);
    return listed.ok() ? *listed : std::vector<std::string>();
  };
  std::vector<std::string> ports;
  const std::string root = "/sys/class/infiniband";
  for (const std::string& device : names(root)) {
    for (const std::string& port : names(root + "/" + device + "/ports")) {
      ports.push_back(device + ":" + port);
    }
  }
  return ports;
}

namespace {

bool SameAddress(const sockaddr* a, const sockaddr_storage& b) {
  if (a == nullptr || a->sa_family != b.ss_family) return false;
  if (a->sa_family == AF_INET) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr,
                       &reinterpret_cast<const sockaddr_in*>(&b)->sin_addr, sizeof(in_addr)) == 0;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// The network interfaces with an address, in getifaddrs' order, and
// (`local` given) the name of the one that holds `local` in *holder.
std::vector<std::string> Interfaces(const sockaddr_storage* local = nullptr, std::string* holder = nullptr) {
  std::vector<std::string> names;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) names.push_back(i->ifa_name);
    if (local != nullptr && holder->empty() && SameAddress(i->ifa_addr, *local)) *holder = i->ifa_name;
  }
  ::freeifaddrs(list);
  return names;
}

// The interface this host sends through to reach host:port (the kernel's
// route, found by connecting a UDP socket, which sends nothing).
StatusOr<std::string> InterfaceTowards(const std::string& coordinator) {
  std::string host;
  uint16_t port = 0;
  HERD_RETURN_IF_ERROR(ParseHostPort(coordinator, "the coordinator", &host, &port));
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return Status::Unavailable("the coordinator's host " + host + ": " + ::gai_strerror(rc));
  std::string why = "no address";
  sockaddr_storage local{};
  bool routed = false;
  for (addrinfo* a = found; a != nullptr && !routed; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      routed = true;
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!routed) return Status::Unavailable("no route to the coordinator at " + coordinator + ": " + why);
  std::string name;
  Interfaces(&local, &name);
  if (name.empty()) {
    return Status::Unavailable("no network interface holds the address this host reaches the coordinator at " +
                               coordinator + " from; name the data plane's with cluster.data_interface");
  }
  return name;
}

}  // namespace

StatusOr<std::string> DataPlaneDevices(const std::string& coordinator, const std::string& data_interface) {
  if (std::getenv("UCX_NET_DEVICES") != nullptr) return std::string();
  if (!data_interface.empty()) {
    std::vector<std::string> known = Interfaces();
    for (const std::string& port : RdmaPorts()) known.push_back(port);
    for (const std::string& name : Split(data_interface, ',')) {
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      std::string have;
      for (const std::string& k : known) have += (have.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("cluster.data_interface: " + HostName() + " has no network interface or RDMA port '" +
                                     name + "' (it has " + have + ")");
    }
    return data_interface;
  }
  HERD_ASSIGN_OR_RETURN(std::string devices, InterfaceTowards(coordinator));
  for (const std::string& port : RdmaPorts()) devices += "," + port;
  return devices;
}

}  // namespace herd::transport
