// Host names and addresses: the one answer to "does only this machine reach
// it?", for every listener that decides by it (the bus's TLS, the dashboard's
// token). Thread-safe (pure).
#pragma once

#include <string>

namespace agentrt {

// True for 127.0.0.0/8, ::1 (with or without brackets) and "localhost".
bool IsLoopbackHost(const std::string& host);

}  // namespace agentrt
