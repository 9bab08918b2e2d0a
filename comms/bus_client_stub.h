// The seam of BusClient: a client over any implementation of the generated
// gRPC stub interface. BusClient::Connect gives it a real channel's stub; tests
// give it one that injects faults around a real broker
// (tests/comms/faulty_bus_stub.h) to drive retries, reconnects and duplicate
// suppression without sleeps.
// A separate header so that users of bus_client.h need no gRPC headers.
#pragma once

#include <memory>
#include <string>

#include "comms/bus_client.h"
#include "comms/proto/bus.grpc.pb.h"

namespace agentrt {

// `address` only names the bus in messages. The stub is used from the
// client's threads concurrently (as a real gRPC stub allows).
Result<std::unique_ptr<BusClient>> MakeBusClientWithStub(
    std::unique_ptr<bus::v1::Bus::StubInterface> stub, std::string address, Credential credential,
    BusClientOptions options = {});

}  // namespace agentrt
