// gRPC's own log lines go through agentrt: escaped (no raw peer bytes on a
// terminal: a handshake error may quote what a stranger sent to the port),
// cut to a sane length, prefixed with where they come from, on stderr.
#pragma once

namespace agentrt {

// Installs the log function once per process (idempotent, thread-safe). The
// bus server and client call it before they start gRPC.
void RouteGrpcLogging();

}  // namespace agentrt
