// server/client_socket.cpp — a request's socket and client-gone detection (see client_socket.h).
#include "server/client_socket.h"

#include <httplib.h>

#include <dirent.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace kiln::server {

int find_client_socket(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    char host[NI_MAXHOST], port[NI_MAXSERV], lport[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), pl, host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) continue;
    if (getnameinfo(reinterpret_cast<sockaddr*>(&self), sl, nullptr, 0, lport, sizeof(lport), NI_NUMERICSERV) != 0) continue;
    if (req.remote_addr == host && req.remote_port == std::atoi(port) && req.local_port == std::atoi(lport)) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace kiln::server
