// server/client_socket.h — finding a request's client socket and noticing that the client left,
//   so a non-streamed generation can be cancelled when nobody waits for its answer.
// Owns: nothing (reads /proc/self/fd and peeks sockets; never closes or reads data off them).
// Must not: consume bytes of the connection or change its state (httplib owns the socket).
// Threading: plain functions; call from the HTTP thread that handles the request.
#pragma once

namespace httplib {
struct Request;
}

namespace kiln::server {

// The accepted socket of a request, found by its addresses: cpp-httplib 0.11 (Debian 12) hands
// handlers neither the socket nor Request::is_connection_closed. Scans /proc/self/fd for the TCP
// socket whose peer is req.remote_addr:remote_port and whose local port is req.local_port; the fd
// stays ours until the handler returns. -1 when not found (then no disconnect detection).
int find_client_socket(const httplib::Request& req);

// True once the peer has closed (orderly FIN or reset). Pending bytes (a pipelined request) or
// nothing to read yet mean it is still there. A client that half-closes its sending side and
// waits for the answer reads as gone (HTTP clients do not do that).
bool peer_closed(int fd);

}  // namespace kiln::server
