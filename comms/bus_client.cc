#include "comms/bus_client.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/random.h"
#include "comms/bus_client_internal.h"
#include "comms/bus_client_stub.h"
#include "comms/bus_log.h"
#include "comms/bus_validate.h"
#include "comms/grpc_log.h"
#include "comms/proto/bus.grpc.pb.h"
#include "plan/fence.h"

namespace agentrt {

using namespace bus_client_internal;  // NOLINT(google-build-using-namespace): its own insides

Result<PublishAck> BusClient::Impl::PublishChunked(std::string_view topic, std::string_view payload,
                                                   const PublishOptions& opts, uint64_t seq) {
  // Unless told, call_timeout plus a second per 64 MiB (1 GiB: 26 s by default).
  const auto deadline =
      DeadlineClock::now() +
      opts.timeout.value_or(options.call_timeout +
                            std::chrono::seconds(static_cast<int64_t>(payload.size() >> 26)));
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  const std::string what = "publish of " + std::to_string(payload.size()) + " bytes to topic \"" +
                           std::string(topic) + "\" (bus " + address + ", agent " + cred.agent +
                           ")";
  v1::PublishChunk chunk;
  v1::PublishResponse resp;  // read only after an attempt that ended OK
  auto attempt = [&](int) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    auto writer = stub->PublishLarge(&ctx, &resp);
    chunk.Clear();
    v1::PublishRequest* head = chunk.mutable_head();
    head->set_topic(std::string(topic));
    head->set_content_type(opts.content_type);
    head->set_publisher_id(publisher_id);
    head->set_sequence(seq);
    chunk.set_size(static_cast<int64_t>(payload.size()));
    chunk.set_crc32c(crc);
    size_t pos = 0;
    bool sent = true;
    while (pos < payload.size()) {
      const size_t n = std::min(payload.size() - pos, static_cast<size_t>(kChunkBytes));
      chunk.set_data(payload.data() + pos, n);
      if (!writer->Write(chunk)) {  // the broker answered already (an error, or a duplicate)
        sent = false;
        break;
      }
      pos += n;
      chunk.clear_head();
      chunk.clear_size();
      chunk.clear_crc32c();
    }
    if (sent) writer->WritesDone();
    return writer->Finish();
  };
  const grpc::Status s = Retrying(deadline, attempt, RetryableStatus);
  if (!s.ok()) return FromGrpc(s, what);
  return PublishAck{resp.offset(), resp.duplicate(), seq};
}

BusClient::BusClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->async_thread = std::thread([this] { impl_->RunAsyncPublisher(); });
}

BusClient::~BusClient() {
  Flush(impl_->options.call_timeout).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(impl_->async_mu);
    impl_->async_stop = true;
  }
  impl_->async_cv.notify_all();
  impl_->async_thread.join();
  std::vector<SubscriptionId> ids;
  {
    std::lock_guard<std::mutex> lock(impl_->subs_mu);
    for (const auto& [id, s] : impl_->subs) ids.push_back(id);
  }
  for (auto id : ids) Unsubscribe(id).IgnoreError();
}

struct BusClientStubAccess {
  static std::unique_ptr<BusClient> Make(std::unique_ptr<BusClient::Impl> impl) {
    return std::unique_ptr<BusClient>(new BusClient(std::move(impl)));
  }
  static BusClient::Impl& ImplOf(BusClient& client) { return *client.impl_; }
  static std::unique_ptr<BusClient::Impl> NewImpl() { return std::make_unique<BusClient::Impl>(); }
};

Result<std::unique_ptr<BusClient>> BusClient::Connect(std::string address, Credential credential,
                                                      BusClientOptions options) {
  if (address.empty()) return InvalidArgument("bus client: empty bus address (expected host:port)");
  if (credential.agent.empty() || credential.token.empty()) {
    return InvalidArgument("bus client: the credential has no agent name or no token");
  }
  // bus.mtls: the credential's own certificate, unless the caller names one.
  if (options.tls_cert_file.empty() && !options.tls_ca_file.empty()) {
    options.tls_cert_file = credential.cert_file;
    options.tls_key_file = credential.key_file;
  }
  RouteGrpcLogging();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    AGENTRT_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadTlsFile(options.tls_ca_file, "bus TLS CA"));
    if (!options.tls_cert_file.empty()) {
      AGENTRT_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                               ReadTlsFile(options.tls_cert_file, "bus TLS client certificate"));
      AGENTRT_ASSIGN_OR_RETURN(ssl.pem_private_key,
                               ReadTlsFile(options.tls_key_file, "bus TLS client key"));
    }
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  auto client = MakeBusClientWithStub(v1::Bus::NewStub(channel), std::move(address),
                                      std::move(credential), std::move(options));
  if (client.ok()) BusClientStubAccess::ImplOf(**client).channel = std::move(channel);
  return client;
}

Result<std::unique_ptr<BusClient>> MakeBusClientWithStub(
    std::unique_ptr<bus::v1::Bus::StubInterface> stub, std::string address, Credential credential,
    BusClientOptions options) {
  if (stub == nullptr) return InvalidArgument("bus client: no stub");
  if (credential.agent.empty() || credential.token.empty()) {
    return InvalidArgument("bus client: the credential has no agent name or no token");
  }
  auto impl = BusClientStubAccess::NewImpl();
  impl->stub = std::move(stub);
  impl->address = std::move(address);
  impl->cred = std::move(credential);
  impl->publisher_id = options.publisher_id != 0 ? options.publisher_id : RandomNonZeroU64();
  if (const char* local = std::getenv("AGENTRT_BUS_LOCAL_FILES"); local != nullptr) {
    options.read_local_files = std::string_view(local) == "1";
    if (std::string_view(local) == "0") {
      // Nor does Fetch (and so a weight stream) read the broker's files:
      // their bytes are streamed, as on another node.
      options.write_local_files = false;
      impl->broker_files_unreadable = true;
    }
  }
  impl->options = std::move(options);
  return BusClientStubAccess::Make(std::move(impl));
}

Result<std::unique_ptr<BusClient>> BusClient::FromEnvironment(BusClientOptions options) {
  AGENTRT_ASSIGN_OR_RETURN(const AgentEnv env, AgentEnv::FromProcess());
  return ForAgent(env, std::move(options));
}

Result<std::unique_ptr<BusClient>> BusClient::ForAgent(const AgentEnv& env,
                                                       BusClientOptions options) {
  if (env.bus.empty()) {
    return FailedPrecondition("agent " + env.agent +
                              ": AGENTRT_BUS is not set: this run has no message bus");
  }
  if (env.token_file.empty()) {
    return FailedPrecondition(
        "agent " + env.agent +
        ": AGENTRT_TOKEN_FILE is not set; is this process started by agentctl run?");
  }
  AGENTRT_ASSIGN_OR_RETURN(Credential cred, ReadTokenFile(env.token_file));
  // A TLS bus: trust exactly the CA the run names (the caller's own wins).
  if (options.tls_ca_file.empty()) options.tls_ca_file = env.bus_ca_file;
  if (options.incarnation.empty()) {
    AGENTRT_ASSIGN_OR_RETURN(options.incarnation, LaunchIncarnation(env));
  }
  return Connect(env.bus, std::move(cred), std::move(options));
}

const std::string& BusClient::agent() const { return impl_->cred.agent; }
const std::string& BusClient::address() const { return impl_->address; }
bool BusClient::reads_broker_files() const { return !impl_->broker_files_unreadable.load(); }
std::chrono::milliseconds BusClient::call_timeout() const { return impl_->options.call_timeout; }

std::string BusClient::NodeCacheDir() {
  std::lock_guard<std::mutex> lock(impl_->node_dir_mu);
  struct stat st {};
  if (impl_->node_dir_tried && !impl_->node_dir.dir().empty() &&
      ::stat(impl_->node_dir.dir().c_str(), &st) != 0) {
    impl_->node_dir.Leave();  // removed under us: join anew
    impl_->node_dir_tried = false;
  }
  if (!impl_->node_dir_tried) {
    impl_->node_dir_tried = true;
    const char* off = std::getenv("AGENTRT_WEIGHTS_NODE_CACHE");
    if (off == nullptr || std::string_view(off) != "0") {
      // Folders whose processes were all killed go first.
      SweepSharedNodeDirs(kMpiShmRoot, kBusNodeDirPrefix);
      char hash[9];
      std::snprintf(hash, sizeof(hash), "%08x",
                    Crc32c(impl_->address.data(), impl_->address.size()));
      const std::string name =
          std::string(kBusNodeDirPrefix) + std::to_string(::getuid()) + "." + std::string(hash);
      impl_->node_dir = SharedNodeDir::Join(kMpiShmRoot, name);
    }
  }
  return impl_->node_dir.dir();
}

void BusClient::DropNodeCacheDir() {
  std::lock_guard<std::mutex> lock(impl_->node_dir_mu);
  impl_->node_dir.Leave();
  impl_->node_dir_tried = true;  // not joined again
}
uint64_t BusClient::publisher_id() const { return impl_->publisher_id; }
uint64_t BusClient::NextSequence() const { return impl_->next_sequence.load(); }
void BusClient::SetNextSequence(uint64_t next) { impl_->next_sequence.store(next == 0 ? 1 : next); }

Status BusClient::WaitForReady(std::chrono::milliseconds timeout) {
  const auto deadline = DeadlineClock::now() + timeout;
  const grpc::Status s = impl_->Retrying(
      deadline,
      [&](int) {
        grpc::ClientContext ctx;
        impl_->Prepare(&ctx, deadline);
        ctx.set_wait_for_ready(true);
        v1::StatsResponse resp;
        return impl_->stub->Stats(&ctx, v1::StatsRequest(), &resp);
      },
      [](const grpc::Status& got) { return got.error_code() == grpc::StatusCode::UNAVAILABLE; });
  if (s.ok()) return Status::Ok();
  return FromGrpc(s, "waiting for the bus at " + impl_->address);
}

Result<PublishAck> BusClient::Publish(std::string_view topic, std::string_view payload,
                                      const PublishOptions& opts) {
  if (static_cast<int64_t>(payload.size()) > kMaxInlineBytes) {
    const uint64_t seq = impl_->SequenceFor(opts);
    auto copy = [&](LargePayloadWriter& w) { return w.Append(payload.data(), payload.size()); };
    if (auto spooled = impl_->PublishSpooled(topic, payload.size(), copy, opts, seq))
      return *spooled;
    return impl_->PublishChunked(topic, payload, opts, seq);
  }
  v1::PublishRequest req;
  req.set_topic(std::string(topic));
  return impl_->Store<v1::PublishResponse>(&v1::Bus::StubInterface::Publish, req, payload, opts,
                                           "publish to topic \"" + std::string(topic) + "\"");
}

Result<PublishAck> BusClient::Send(std::string_view to, std::string_view payload,
                                   const PublishOptions& opts) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "send to agent " + std::string(to)));
  v1::SendRequest req;
  req.set_to(std::string(to));
  return impl_->Store<v1::SendResponse>(&v1::Bus::StubInterface::Send, req, payload, opts,
                                        "send to agent " + std::string(to));
}

Result<BusReply> BusClient::Request(std::string_view to, std::string_view payload,
                                    std::chrono::milliseconds timeout,
                                    std::string_view content_type) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "request to agent " + std::string(to)));
  v1::RequestRequest req;
  req.set_to(std::string(to));
  req.set_payload(std::string(payload));
  req.set_content_type(std::string(content_type));
  v1::RequestResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, DeadlineClock::now() + timeout);
  // Not retried: the request may already sit in the receiver's inbox.
  grpc::Status s = impl_->stub->Request(&ctx, req, &resp);
  if (!s.ok()) {
    return FromGrpc(s, "request to agent " + std::string(to) + " (bus " + impl_->address +
                           ", agent " + impl_->cred.agent + ")");
  }
  return BusReply{std::move(*resp.mutable_payload()), std::move(*resp.mutable_content_type()),
                  std::move(*resp.mutable_replier())};
}

Status BusClient::Reply(uint64_t request_id, std::string_view payload,
                        std::string_view content_type) {
  AGENTRT_RETURN_IF_ERROR(CheckInline(payload, "reply to request " + std::to_string(request_id)));
  v1::ReplyRequest req;
  req.set_request_id(request_id);
  req.set_payload(std::string(payload));
  req.set_content_type(std::string(content_type));
  v1::ReplyResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, DeadlineClock::now() + impl_->options.call_timeout);
  return FromGrpc(
      impl_->stub->Reply(&ctx, req, &resp),
      "reply to request " + std::to_string(request_id) + " (agent " + impl_->cred.agent + ")");
}

namespace {

// Whether this process can read the files the broker named in `msgs`.
enum class BrokerFiles {
  kReadable,
  kNotHere,  // their folder is not here, or this user may not read them: another node's
  kMissing,  // a file is not there now (retention removed it, or a folder of the same
             // name on another node): its bytes are asked for this time
};

BrokerFiles BrokerFilesHere(const std::vector<BusMessage>& msgs) {
  BrokerFiles out = BrokerFiles::kReadable;
  for (const auto& m : msgs) {
    const std::string& path = m.chunked_path();
    if (path.empty() || ::faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS) == 0) continue;
    const int err = errno;
    const std::string folder = path.substr(0, path.rfind('/') + 1);
    const bool folder_here = ::faccessat(AT_FDCWD, folder.c_str(), X_OK, AT_EACCESS) == 0;
    if (err == EACCES || err == EPERM || (err == ENOENT && !folder_here))
      return BrokerFiles::kNotHere;
    out = BrokerFiles::kMissing;  // or a passing error (ESTALE, EIO): not remembered
  }
  return out;
}

// BrokerFilesHere, remembered in `unreadable` when their folder is not here.
BrokerFiles NoteBrokerFiles(std::atomic<bool>& unreadable, const std::vector<BusMessage>& msgs) {
  const BrokerFiles here = BrokerFilesHere(msgs);
  if (here == BrokerFiles::kNotHere) unreadable.store(true);
  return here;
}

}  // namespace

bool BusClient::BrokerFileReadable(const BusMessage& m) {
  if (impl_->broker_files_unreadable.load()) return false;
  return NoteBrokerFiles(impl_->broker_files_unreadable, {m}) == BrokerFiles::kReadable;
}

Result<std::vector<BusMessage>> BusClient::Fetch(std::string_view topic, int64_t offset, int max,
                                                 std::chrono::milliseconds timeout,
                                                 const FetchOptions& fetch) {
  if (max <= 0) return InvalidArgument("fetch: max must be > 0");
  const auto deadline = DeadlineClock::now() + timeout;
  // A fetch only reads: one that found the connection broken (a broker that
  // restarted) is tried again while the caller's time lasts, as Publish is.
  auto fetch_once = [&](int64_t from, bool local_files, DeadlineClock::time_point until) {
    return impl_->Retrying(
        until,
        [&](int) {
          const auto left = std::max(
              std::chrono::milliseconds(1),
              std::chrono::duration_cast<std::chrono::milliseconds>(until - DeadlineClock::now()));
          return impl_->FetchOnce(topic, from, max, left, local_files);
        },
        [](const Result<std::vector<BusMessage>>& got) {
          return !got.ok() && got.status().code() == StatusCode::kUnavailable;
        });
  };
  if (fetch.local_paths && fetch.metadata_only)
    return fetch_once(offset, /*local_files=*/true, deadline);
  const bool local = fetch.local_paths && !impl_->broker_files_unreadable.load();
  AGENTRT_ASSIGN_OR_RETURN(std::vector<BusMessage> out, fetch_once(offset, local, deadline));
  if (!local || out.empty()) return out;
  if (NoteBrokerFiles(impl_->broker_files_unreadable, out) == BrokerFiles::kReadable) return out;
  // The messages exist: their bytes get what is left of the caller's time,
  // and at least a call's (the first fetch may have waited for them).
  return fetch_once(out.front().offset(), /*local_files=*/false,
                    std::max(deadline, DeadlineClock::now() + impl_->options.call_timeout));
}

Result<std::vector<BusMessage>> BusClient::Impl::FetchOnce(std::string_view topic, int64_t offset,
                                                           int max,
                                                           std::chrono::milliseconds timeout,
                                                           bool local_files) {
  v1::SubscribeRequest req;
  req.set_topic(std::string(topic));
  req.mutable_start()->set_offset(offset);
  req.set_max_batch_messages(std::min(max, 4096));
  req.set_local_files(local_files);
  grpc::ClientContext ctx;
  Prepare(&ctx, DeadlineClock::now() + timeout);
  auto reader = stub->Subscribe(&ctx, req);
  std::vector<BusMessage> out;
  v1::SubscribeResponse resp;
  Reassembler assembler(/*pass_paths=*/local_files);
  Status broken;
  bool ended = false;  // the broker ended the stream: its status says why
  while (static_cast<int>(out.size()) < max) {
    if (!reader->Read(&resp)) {
      ended = true;
      break;
    }
    broken = assembler.Feed(resp, [&](auto&& m) {  // a reassembled one is moved
      if (static_cast<int>(out.size()) < max) out.push_back(std::forward<decltype(m)>(m));
    });
    if (!broken.ok() || !out.empty()) break;  // return what the first batch brought
  }
  if (!ended) ctx.TryCancel();
  grpc::Status s = reader->Finish();
  if (!out.empty()) return out;
  AGENTRT_RETURN_IF_ERROR(
      broken.WithContext("fetch from topic \"" + std::string(topic) + "\" (bus " + address + ")"));
  if (s.ok() || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::CANCELLED) {
    return out;  // nothing arrived in time
  }
  return FromGrpc(s, "fetch from topic \"" + std::string(topic) + "\" (bus " + address + ")");
}

Result<std::vector<BusTopicInfo>> BusClient::ListTopics(std::string_view topic) {
  v1::ListTopicsRequest req;
  req.set_topic(std::string(topic));
  v1::ListTopicsResponse resp;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, DeadlineClock::now() + impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(FromGrpc(impl_->stub->ListTopics(&ctx, req, &resp),
                                   "list topics (bus " + impl_->address + ")"));
  return std::vector<BusTopicInfo>(resp.topics().begin(), resp.topics().end());
}

Result<BusStats> BusClient::Stats() {
  v1::StatsResponse r;
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, DeadlineClock::now() + impl_->options.call_timeout);
  AGENTRT_RETURN_IF_ERROR(FromGrpc(impl_->stub->Stats(&ctx, v1::StatsRequest(), &r),
                                   "bus stats (" + impl_->address + ")"));
  BusStats s;
#define AGENTRT_GET_STAT(type, name) s.name = r.name();
  AGENTRT_BUS_STATS(AGENTRT_GET_STAT)
#undef AGENTRT_GET_STAT
  return s;
}

}  // namespace agentrt
