#include "comms/bus_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/file_util.h"
#include "common/random.h"
#include "comms/grpc_log.h"
#include "comms/proto/bus.grpc.pb.h"
#include "fmt/format.h"
#include "plan/run_dir.h"

namespace agentrt {
namespace {

namespace v1 = bus::v1;

static_assert(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED) ==
                      static_cast<int>(agentrt::StatusCode::kUnauthenticated) &&
                  static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT) ==
                      static_cast<int>(agentrt::StatusCode::kInvalidArgument),
              "agentrt::StatusCode is numbered as gRPC's");

// The one place where agentrt::Status becomes a gRPC status.
grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(s.code()), s.message()};
}

std::string_view Metadata(const grpc::ServerContext* ctx, std::string_view key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return {};
  return {it->second.data(), it->second.size()};
}

// Authenticates the call or returns UNAUTHENTICATED; binds `var` to the agent name.
// NOLINTNEXTLINE(bugprone-macro-parentheses): `var` names the variable it declares
#define AGENTRT_AUTH_OR_RETURN(var)                         \
  Result<std::string> var##_auth = Authenticate(ctx);       \
  if (!var##_auth.ok()) return ToGrpc(var##_auth.status()); \
  const std::string& var = var##_auth.value()

constexpr auto kStreamPoll = std::chrono::milliseconds(100);

class BusService final : public v1::Bus::Service {
 public:
  BusService(Broker* broker, bool client_is_agent)
      : broker_(broker), client_is_agent_(client_is_agent) {}

  void CloseStreams() { stream_generation_.fetch_add(1, std::memory_order_acq_rel); }

  grpc::Status Publish(grpc::ServerContext* ctx, const v1::PublishRequest* req,
                       v1::PublishResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    // The request is ours for this call; moving its payload saves a copy.
    return ToGrpc(broker_->Publish(agent, const_cast<v1::PublishRequest&>(*req), resp));
  }

  grpc::Status PublishBatch(grpc::ServerContext* ctx, const v1::PublishBatchRequest* req,
                            v1::PublishBatchResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    // The request is ours for this call; moving payloads out of it saves a copy.
    return ToGrpc(broker_->PublishBatch(agent, const_cast<v1::PublishBatchRequest&>(*req), resp));
  }

  grpc::Status PublishStream(grpc::ServerContext* ctx,
                             grpc::ServerReaderWriter<v1::PublishBatchResponse,
                                                      v1::PublishBatchRequest>* stream) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    const std::string_view launch = Metadata(ctx, "x-agentrt-incarnation");
    v1::PublishBatchRequest req;
    v1::PublishBatchResponse resp;
    while (stream->Read(&req)) {
      resp.Clear();
      // A launch replaced while its stream was open is refused from then on.
      Status s = broker_->CheckIncarnation(agent, launch);
      if (s.ok()) s = broker_->PublishBatch(agent, req, &resp);
      if (!s.ok()) {
        stream->Write(resp);
        return ToGrpc(s);
      }
      if (!stream->Write(resp))
        return grpc::Status(grpc::StatusCode::CANCELLED, "publisher went away");
      if (broker_->shutting_down())
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the bus broker is shutting down");
    }
    return grpc::Status::OK;
  }

  grpc::Status PublishLarge(grpc::ServerContext* ctx, grpc::ServerReader<v1::PublishChunk>* reader,
                            v1::PublishResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    v1::PublishChunk chunk;
    if (!reader->Read(&chunk)) {
      broker_->CountInvalid();
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a large publish with no chunk");
    }
    Result<std::shared_ptr<Broker::Upload>> upload = broker_->BeginLarge(agent, chunk, resp);
    if (!upload.ok()) return ToGrpc(upload.status());
    if (*upload == nullptr) return grpc::Status::OK;  // a duplicate, answered
    while (reader->Read(&chunk)) {
      if (chunk.has_head()) {
        broker_->CountInvalid();
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "a large publish with a second head; nothing stored");
      }
      if (Status s = broker_->WriteLarge(**upload, chunk.data()); !s.ok()) return ToGrpc(s);
      if (broker_->shutting_down())
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the bus broker is shutting down");
    }
    if (ctx->IsCancelled())
      return grpc::Status(grpc::StatusCode::CANCELLED, "publisher went away; nothing stored");
    return ToGrpc(broker_->FinishLarge(**upload, resp));
  }

  grpc::Status Spool(grpc::ServerContext* ctx, const v1::SpoolRequest* req,
                     v1::SpoolResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    return ToGrpc(broker_->SpoolInfo(agent, *req, resp));
  }

  grpc::Status AdoptLarge(grpc::ServerContext* ctx, const v1::AdoptRequest* req,
                          v1::PublishResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    v1::AdoptRequest copy = *req;
    return ToGrpc(broker_->AdoptLarge(agent, copy, resp));
  }

  grpc::Status Subscribe(grpc::ServerContext* ctx, const v1::SubscribeRequest* req,
                         grpc::ServerWriter<v1::SubscribeResponse>* writer) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    v1::SubscribeResponse first;
    Result<Broker::Reader> reader = broker_->OpenTopicReader(agent, *req, first.mutable_header());
    if (!reader.ok()) return ToGrpc(reader.status());
    return Stream(ctx, &reader.value(), &first, writer, "topic \"" + req->topic() + "\"", agent);
  }

  grpc::Status Receive(grpc::ServerContext* ctx, const v1::ReceiveRequest* req,
                       grpc::ServerWriter<v1::SubscribeResponse>* writer) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    v1::SubscribeResponse first;
    Result<Broker::Reader> reader = broker_->OpenInboxReader(agent, *req, first.mutable_header());
    if (!reader.ok()) return ToGrpc(reader.status());
    return Stream(ctx, &reader.value(), &first, writer, "inbox of agent " + agent, agent);
  }

  grpc::Status Send(grpc::ServerContext* ctx, const v1::SendRequest* req,
                    v1::SendResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    return ToGrpc(broker_->Send(agent, const_cast<v1::SendRequest&>(*req), resp));
  }

  grpc::Status Request(grpc::ServerContext* ctx, const v1::RequestRequest* req,
                       v1::RequestResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    // A call without a deadline still must not wait forever.
    auto deadline = ctx->deadline();
    const auto cap = std::chrono::system_clock::now() + std::chrono::hours(1);
    if (deadline > cap) deadline = cap;
    return ToGrpc(broker_->Request(
        agent, const_cast<v1::RequestRequest&>(*req), deadline,
        [ctx] { return ctx->IsCancelled(); }, resp));
  }

  grpc::Status Reply(grpc::ServerContext* ctx, const v1::ReplyRequest* req,
                     v1::ReplyResponse*) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    return ToGrpc(broker_->Reply(agent, const_cast<v1::ReplyRequest&>(*req)));
  }

  grpc::Status ListTopics(grpc::ServerContext* ctx, const v1::ListTopicsRequest* req,
                          v1::ListTopicsResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    for (auto& t : broker_->ListTopics(agent, req->topic())) *resp->add_topics() = std::move(t);
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    AGENTRT_AUTH_OR_RETURN(agent);
    (void)agent;
    BusStats s = broker_->Stats();
#define AGENTRT_SET_STAT(type, name) resp->set_##name(s.name);
    AGENTRT_BUS_STATS(AGENTRT_SET_STAT)
#undef AGENTRT_SET_STAT
    return grpc::Status::OK;
  }

 private:
  Result<std::string> Authenticate(const grpc::ServerContext* ctx) {
    std::string agent(Metadata(ctx, "x-agentrt-agent"));
    AGENTRT_RETURN_IF_ERROR(broker_->Authenticate(agent, Metadata(ctx, "x-agentrt-token"),
                                                  Metadata(ctx, "x-agentrt-incarnation")));
    if (client_is_agent_) AGENTRT_RETURN_IF_ERROR(CertificateNames(ctx, agent));
    return agent;
  }

  // bus.mtls: the verified client certificate's common name is `agent`.
  static Status CertificateNames(const grpc::ServerContext* ctx, const std::string& agent) {
    const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    const std::vector<grpc::string_ref> names =
        auth ? auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)
             : std::vector<grpc::string_ref>{};
    if (names.size() == 1 && std::string_view(names[0].data(), names[0].size()) == agent)
      return Status::Ok();
    return Status(StatusCode::kUnauthenticated,
                  fmt::format("the client certificate names {}, not agent {}",
                              names.empty() ? std::string("nobody")
                                            : std::string(names[0].data(), names[0].size()),
                              agent));
  }

  grpc::Status Stream(grpc::ServerContext* ctx, Broker::Reader* reader,
                      v1::SubscribeResponse* first,
                      grpc::ServerWriter<v1::SubscribeResponse>* writer, const std::string& what,
                      const std::string& agent) {
    broker_->StreamOpened();
    broker_->Track(reader, agent);
    struct Closer {
      Broker* b;
      const Broker::Reader* r;
      ~Closer() {
        b->Untrack(r);
        b->StreamClosed();
      }
    } closer{broker_, reader};
    const uint64_t generation = stream_generation_.load(std::memory_order_acquire);
    if (!writer->Write(*first))
      return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
    v1::SubscribeResponse resp;
    v1::SubscribeResponse chunk;  // a large message's bytes, one chunk at a time (buffer reused)
    Broker::Lease lease(&resp);   // declared after resp: gives the messages back before resp goes
    // Why the stream must end now, if it must (between batches, and between
    // a large message's chunks: the client then resumes at that message).
    const std::string_view launch = Metadata(ctx, "x-agentrt-incarnation");
    auto must_end = [&]() -> std::optional<grpc::Status> {
      if (ctx->IsCancelled())
        return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
      // A launch replaced while its stream was open (Broker::SetIncarnation).
      if (Status fenced = broker_->CheckIncarnation(agent, launch); !fenced.ok())
        return ToGrpc(fenced);
      if (broker_->shutting_down())
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the bus broker is shutting down");
      if (stream_generation_.load(std::memory_order_acquire) != generation) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the bus broker closed this stream; resume at the next offset");
      }
      return std::nullopt;
    };
    for (;;) {
      if (auto end = must_end()) return *end;
      lease.Release();  // before Clear, which would otherwise clear the stored messages
      resp.Clear();
      int64_t earliest = 0;
      switch (broker_->ReadBorrowed(reader, kStreamPoll, &lease, &earliest)) {
        case Broker::ReadOutcome::kIdle:
          break;
        case Broker::ReadOutcome::kMessages:
          if (reader->chunked && reader->local_files) {
            // The reader reads the payload from the file itself: the message
            // (a copy, with the file's path) and no chunks.
            chunk.Clear();
            v1::Message* m = chunk.add_messages();
            *m = resp.messages(0);
            m->set_chunked_path(broker_->ChunkedPath(*reader));
            if (!writer->Write(chunk))
              return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
            break;
          }
          if (!writer->Write(resp))
            return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
          if (reader->chunked) {
            // A large message: its bytes follow, chunk by chunk from its file,
            // so a stream holds one chunk whatever the size.
            const int64_t size = resp.messages(0).chunked_size();
            for (int64_t pos = 0; pos < size;) {
              if (auto end = must_end()) return *end;
              chunk.clear_messages();
              if (Status s = broker_->ReadChunk(*reader, pos, kChunkBytes, chunk.mutable_chunk());
                  !s.ok())
                return ToGrpc(s);
              pos += static_cast<int64_t>(chunk.chunk().size());
              if (!writer->Write(chunk))
                return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber went away");
            }
          }
          break;
        case Broker::ReadOutcome::kExpired: {
          auto* e = resp.mutable_expired();
          e->set_requested_offset(reader->next_offset);
          e->set_earliest_offset(earliest);
          writer->Write(resp);
          ctx->AddTrailingMetadata("x-agentrt-earliest-offset", std::to_string(earliest));
          return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                              "OFFSET_EXPIRED: " + what + " offset " +
                                  std::to_string(reader->next_offset) +
                                  " is no longer retained; the earliest available offset is " +
                                  std::to_string(earliest));
        }
      }
    }
  }

  Broker* broker_;
  const bool client_is_agent_;
  std::atomic<uint64_t> stream_generation_{0};
};

}  // namespace

struct BusServer::Impl {
  BusServerOptions options;
  std::unique_ptr<Broker> broker;
  std::unique_ptr<BusService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::mutex shutdown_mu;
  bool stopped = false;
  std::vector<std::string> notes;  // from recovering the durable log
};

Result<BrokerOptions> BrokerOptionsFor(const BusConfig& settings, const std::string& log_dir) {
  BrokerOptions b;
  b.limits.max_message_bytes = settings.max_message_bytes;
  b.retention_messages = settings.retention;
  b.retention_bytes = settings.retention_bytes;
  b.retention_age_s = settings.retention_age_s;
  auto durability = ParseBusDurability(settings.durability);
  if (!durability.ok()) return durability.status().WithContext("bus.durability");
  b.durability = *durability;
  b.fsync_interval_ms = settings.fsync_interval_ms;
  b.segment_bytes = settings.segment_bytes;
  b.log_dir = log_dir;
  return b;
}

BusServer::BusServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BusServer::~BusServer() { Shutdown(); }

Result<std::unique_ptr<BusServer>> BusServer::Start(const BusServerOptions& options,
                                                    std::string secret, BusAcl acl) {
  if (secret.empty()) return InvalidArgument("bus server: the run secret is empty");
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("bus server: port " + std::to_string(options.port) +
                           " is outside 0..65535");
  }
  const auto& b = options.broker;
  if (b.limits.max_message_bytes <= 0 || b.retention_messages <= 0 || b.retention_bytes <= 0) {
    return InvalidArgument(
        "bus server: max_message_bytes, retention and retention_bytes must be > 0");
  }
  if (b.limits.max_message_bytes > kMaxMessageBytesCeiling) {
    return InvalidArgument(
        fmt::format("bus server: max_message_bytes {} is above the ceiling of {}",
                    b.limits.max_message_bytes, kMaxMessageBytesCeiling));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  uint64_t incarnation = options.incarnation;
  const bool durable = !b.log_dir.empty() && b.durability != BusDurability::kMemory;
  const std::string incarnation_path = BusIncarnationFile(b.log_dir);
  if (durable) {
    // The logs outlive this broker, and so does the incarnation that saved
    // positions carry: a restarted broker is the same log to its readers.
    auto saved = ReadWholeFile(incarnation_path, 64);
    if (saved.ok()) {
      std::string_view text = *saved;
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.remove_suffix(1);
      const std::optional<uint64_t> parsed = ParseHex64(text);
      if (!parsed || *parsed == 0)
        return DataLoss("bus log: " + incarnation_path + " does not hold an incarnation");
      incarnation = *parsed;
    } else if (saved.status().code() != StatusCode::kNotFound) {
      return saved.status();
    }
  }
  while (incarnation == 0 || incarnation == kMixedIncarnation) incarnation = RandomNonZeroU64();
  if (durable) {
    std::error_code ec;
    std::filesystem::create_directories(b.log_dir, ec);
    AGENTRT_RETURN_IF_ERROR(
        WriteFileAtomic(incarnation_path, Hex64(incarnation) + "\n", {0644, /*sync_dir=*/true}));
  }
  impl->broker =
      std::make_unique<Broker>(options.broker, std::move(acl), std::move(secret), incarnation);
  AGENTRT_RETURN_IF_ERROR(impl->broker->Recover(&impl->notes));
  impl->service = std::make_unique<BusService>(
      impl->broker.get(), options.tls_client_is_agent && !options.tls_client_ca_file.empty());

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options.tls_cert_file.empty()) {
    AGENTRT_ASSIGN_OR_RETURN(std::string cert,
                             ReadTlsFile(options.tls_cert_file, "bus TLS certificate"));
    AGENTRT_ASSIGN_OR_RETURN(std::string key, ReadTlsFile(options.tls_key_file, "bus TLS key"));
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    if (!options.tls_client_ca_file.empty()) {
      AGENTRT_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                               ReadTlsFile(options.tls_client_ca_file, "bus TLS client CA"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  const std::string listen =
      (options.host.find(':') != std::string::npos && options.host.front() != '['
           ? "[" + options.host + "]"
           : options.host) +
      ":" + std::to_string(options.port);
  RouteGrpcLogging();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, creds, &impl->port);
  builder.RegisterService(impl->service.get());
  // A call carries at most kMaxBatchBytes of payload (a batch, or one message
  // of up to kMaxInlineBytes; larger ones come in chunks), plus framing.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::max<int64_t>(kMaxBatchBytes, kMaxInlineBytes) + (1 << 20)));
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Accept client keepalive pings as often as clients are configured to send them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Let a large message flow without waiting for window updates.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  // gRPC sets SO_REUSEPORT by default: a second broker would bind the same
  // port silently and the kernel would split connections between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return Unavailable("bus server: cannot listen on " + listen +
                       " (port in use, or bad address?)");
  }
  return std::unique_ptr<BusServer>(new BusServer(std::move(impl)));
}

int BusServer::port() const { return impl_->port; }

std::string BusServer::address() const {
  std::string host = impl_->options.host;
  if (host == "0.0.0.0" || host.empty()) host = "127.0.0.1";
  if (host == "::" || host == "[::]") host = "[::1]";
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  return host + ":" + std::to_string(impl_->port);
}

void SetServerTls(const BusConfig& settings, BusServerOptions& options) {
  if (settings.tls != kBusTlsOn) return;
  options.tls_cert_file = settings.cert_file;
  options.tls_key_file = settings.key_file;
  if (settings.mtls) {
    options.tls_client_ca_file = settings.ClientCaFile();
    options.tls_client_is_agent = true;
  }
}

uint64_t BusServer::incarnation() const { return impl_->broker->incarnation(); }
void BusServer::SetAgentIncarnation(const std::string& agent, const std::string& incarnation) {
  impl_->broker->SetIncarnation(agent, incarnation);
}
const std::vector<std::string>& BusServer::recovery_notes() const { return impl_->notes; }

BusSnapshot BusServer::Snapshot() const {
  BusSnapshot snapshot;
  for (const auto& t : impl_->broker->ListTopics("")) {
    snapshot.topics.push_back({.topic = t.topic(),
                               .earliest_offset = t.earliest_offset(),
                               .end_offset = t.end_offset(),
                               .retained_bytes = t.retained_bytes()});
  }
  for (const auto& r : impl_->broker->Readers()) {
    snapshot.subscribers.push_back({.agent = r.agent,
                                    .topic = r.log,
                                    .offset = r.next_offset,
                                    .lag = std::max<int64_t>(0, r.end_offset - r.next_offset)});
  }
  const BusStats s = impl_->broker->Stats();
  snapshot.messages_published = s.messages_published;
  snapshot.messages_delivered = s.messages_delivered;
  return snapshot;
}
BusStats BusServer::Stats() const { return impl_->broker->Stats(); }
void BusServer::CloseStreams() { impl_->service->CloseStreams(); }

void BusServer::Shutdown(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->broker->Shutdown();  // wakes stream loops and pending Requests so they end now
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
}

}  // namespace agentrt
