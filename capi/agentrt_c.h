/* agentrt's C API: the runtime of an agent process for any language that can
 * call C (Python's agentrt package is written over it with ctypes).
 *
 * Built as the shared library libagentrt_c.so; only agentrt_* symbols are
 * exported. No C++ type or exception crosses it: handles are opaque, every
 * call that can fail returns a status code (enum agentrt_code, the numbering
 * of gRPC's canonical codes) and leaves a message for the calling thread in
 * agentrt_last_error(). Strings and JSON documents that the library hands out
 * through a `char**` are the caller's, freed with agentrt_free().
 *
 *   agentrt_runtime* rt;
 *   if (agentrt_runtime_open(1000, 1, &rt) != AGENTRT_OK) {
 *     fprintf(stderr, "%s\n", agentrt_last_error());   // e.g. "AGENTRT_RUN_DIR is not set ..."
 *     return 2;
 *   }
 *   char* who; agentrt_runtime_assignment(rt, &who);   // {"agent": ..., "rank": ..., "args":
 * {...}} agentrt_checkpointer* ck; agentrt_runtime_checkpointer(rt, &ck);
 *   ... agentrt_runtime_report(rt, step, "{\"loss\": 0.5}") ...
 *   agentrt_checkpointer_close(ck); agentrt_runtime_close(rt); agentrt_free(who);
 *
 * Threads: every function may be called from any thread, except where a
 * handle says otherwise (an env pool and a checkpointer belong to one thread
 * at a time, like their C++ types). Blocking calls (bus publish and fetch,
 * checkpoint save and restore, env steps) do not call back into the caller
 * except through the callbacks given to them, which run on the library's own
 * threads.
 */
#ifndef AGENTRT_CAPI_AGENTRT_C_H_
#define AGENTRT_CAPI_AGENTRT_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define AGENTRT_C_EXPORT __attribute__((visibility("default")))
#else
#define AGENTRT_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define AGENTRT_C_API_VERSION 1

/* ---- Status ------------------------------------------------------------ */

enum agentrt_code {
  AGENTRT_OK = 0,
  AGENTRT_CANCELLED = 1,
  AGENTRT_UNKNOWN = 2,
  AGENTRT_INVALID_ARGUMENT = 3,
  AGENTRT_DEADLINE_EXCEEDED = 4,
  AGENTRT_NOT_FOUND = 5,
  AGENTRT_ALREADY_EXISTS = 6,
  AGENTRT_PERMISSION_DENIED = 7,
  AGENTRT_RESOURCE_EXHAUSTED = 8,
  AGENTRT_FAILED_PRECONDITION = 9,
  AGENTRT_ABORTED = 10,
  AGENTRT_OUT_OF_RANGE = 11,
  AGENTRT_UNIMPLEMENTED = 12,
  AGENTRT_INTERNAL = 13,
  AGENTRT_UNAVAILABLE = 14,
  AGENTRT_DATA_LOSS = 15,
  AGENTRT_UNAUTHENTICATED = 16
};

/* AGENTRT_C_API_VERSION of the library (a caller built against another
 * version should refuse to run). */
AGENTRT_C_EXPORT int agentrt_api_version(void);
/* The message of the calling thread's last failed call ("" when none). Valid
 * until this thread's next call into the library. */
AGENTRT_C_EXPORT const char* agentrt_last_error(void);
/* "INVALID_ARGUMENT", ... ; "UNKNOWN" for a code outside the enum. */
AGENTRT_C_EXPORT const char* agentrt_code_name(int code);
/* Frees a string the library returned through a char** (NULL is fine). */
AGENTRT_C_EXPORT void agentrt_free(void* p);

typedef struct agentrt_runtime agentrt_runtime;
typedef struct agentrt_checkpointer agentrt_checkpointer;
typedef struct agentrt_state agentrt_state;
typedef struct agentrt_restore agentrt_restore;
typedef struct agentrt_bus agentrt_bus;
typedef struct agentrt_weights agentrt_weights;
typedef struct agentrt_message agentrt_message;
typedef struct agentrt_envpool agentrt_envpool;

/* ---- Runtime: the agent's assignment, heartbeats, metrics, stop ---------- */

/* The runtime of a rank started by `agentctl run` (its environment and the
 * run's plan.json). Heartbeats go to the controller every heartbeat_ms (0:
 * 1000) from a thread of the library; with install_signal_handlers, SIGTERM
 * and SIGINT request a stop (and a checkpoint), SIGUSR2 a checkpoint. */
AGENTRT_C_EXPORT int agentrt_runtime_open(int heartbeat_ms, int install_signal_handlers,
                                          agentrt_runtime** out);
/* Says "bye" to the controller, stops the heartbeat, waits for a checkpoint in
 * progress. Handles borrowed from it (checkpointer, bus) must be closed first. */
AGENTRT_C_EXPORT void agentrt_runtime_close(agentrt_runtime* rt);
/* This rank's assignment as one JSON object: run, run_dir, agent, rank,
 * world_size, local_rank, local_world_size, master_addr, master_port,
 * ports [first, last], gpus (this node's), backend, restart_count, ckpt_dir,
 * workdir, bus, args (the agent's `args:`), agents (every agent of the run:
 * [{name, index, ranks, gpus, args}]), checkpoint {interval_s, keep_last}. */
AGENTRT_C_EXPORT int agentrt_runtime_assignment(const agentrt_runtime* rt, char** json_out);
/* Non-blocking: a "metrics" message (a JSON object of numbers and strings)
 * with `step`, which heartbeats carry from now on. Dropped (and counted) when
 * the controller is slow. */
AGENTRT_C_EXPORT int agentrt_runtime_report(agentrt_runtime* rt, int64_t step,
                                            const char* metrics_json);
AGENTRT_C_EXPORT int agentrt_runtime_set_step(agentrt_runtime* rt, int64_t step);
/* The floating-point operations of one sample (what one step counts); status
 * then shows achieved FLOP/s against the partition's peak. 0: not declared. */
AGENTRT_C_EXPORT int agentrt_runtime_set_flops_per_sample(agentrt_runtime* rt, double flops);
/* *stop = 1 once a stop was requested; *reason_out (optional) says why. */
AGENTRT_C_EXPORT int agentrt_runtime_should_stop(const agentrt_runtime* rt, int* stop,
                                                 char** reason_out);
AGENTRT_C_EXPORT int agentrt_runtime_request_stop(agentrt_runtime* rt, const char* reason);
/* {"heartbeats_sent", "telemetry_sent", "telemetry_dropped"}. */
AGENTRT_C_EXPORT int agentrt_runtime_counters(const agentrt_runtime* rt, char** json_out);
/* The agent's Checkpointer (policy from the plan) and bus connection (made on
 * first use), borrowed from the runtime: close them before the runtime. */
AGENTRT_C_EXPORT int agentrt_runtime_checkpointer(agentrt_runtime* rt, agentrt_checkpointer** out);
AGENTRT_C_EXPORT int agentrt_runtime_bus(agentrt_runtime* rt, agentrt_bus** out);

/* ---- Checkpoints (agent_runtime/checkpointer.h) ------------------------ */

/* A checkpointer of its own (outside agentctl, tests): `dir` is created 0700.
 * interval_s <= 0: no timer trigger. */
AGENTRT_C_EXPORT int agentrt_checkpointer_create(const char* dir, const char* agent, int rank,
                                                 int world_size, double interval_s, int keep_last,
                                                 agentrt_checkpointer** out);
/* Waits for a save in progress; frees the handle (a borrowed one: only it). */
AGENTRT_C_EXPORT void agentrt_checkpointer_close(agentrt_checkpointer* ck);
/* *due = 1 when a save was requested (signal, request_save) or interval_s has
 * passed since the last save started, and no save is in progress. */
AGENTRT_C_EXPORT int agentrt_checkpointer_save_due(agentrt_checkpointer* ck, int* due);
AGENTRT_C_EXPORT int agentrt_checkpointer_request_save(agentrt_checkpointer* ck);
/* Saves `state` as `step`. The state's buffers are read before this returns
 * (async: copied into the checkpointer's memory, then written and committed
 * on its thread; the caller may change them at once). A save still in
 * progress is waited for first. */
AGENTRT_C_EXPORT int agentrt_checkpointer_save(agentrt_checkpointer* ck, int64_t step,
                                               const agentrt_state* state, int async);
/* Waits for the save in progress; its outcome. */
AGENTRT_C_EXPORT int agentrt_checkpointer_wait(agentrt_checkpointer* ck);
/* How async saves take host memory from now on: "copy" or "fork"
 * (CheckpointOptions::Snapshot; agents.yaml checkpoint.snapshot). */
AGENTRT_C_EXPORT int agentrt_checkpointer_set_snapshot(agentrt_checkpointer* ck, const char* how);
/* {"dir", "last_saved_step", "saving", "saves_started", "saves_committed",
 * "snapshot", "last_snapshot_s", "last_snapshot_forked", "last_snapshot_fallback",
 * "last_write_s"}. */
AGENTRT_C_EXPORT int agentrt_checkpointer_info(const agentrt_checkpointer* ck, char** json_out);
/* The newest checkpoint that verifies, or a fresh start (see agentrt_restore_info). */
AGENTRT_C_EXPORT int agentrt_checkpointer_restore(agentrt_checkpointer* ck, agentrt_restore** out);
/* The same without reading this rank's shard now, when the checkpoint holds
 * global arrays only (saved with agentrt_state_add_slice): its manifest and
 * every shard's size are checked, and agentrt_restore_read verifies each
 * chunk as it reads it into the caller's memory. A DATA_LOSS from such a read
 * means the step is corrupt: call again with before_step = that step,
 * before_step_error = the read's message and skipped_json = the "skipped"
 * list of agentrt_restore_info ([{"step", "file", "reason"}]) to fall back to
 * an older one, that step listed as skipped; it then removes no debris and
 * calls no barrier. before_step < 0 and both strings NULL: the newest
 * checkpoint. Every rank must read the same arrays to agree
 * on the step. Other checkpoints are loaded as agentrt_checkpointer_restore
 * does. */
AGENTRT_C_EXPORT int agentrt_checkpointer_restore_lazy(agentrt_checkpointer* ck,
                                                       int64_t before_step,
                                                       const char* before_step_error,
                                                       const char* skipped_json,
                                                       agentrt_restore** out);

/* What one rank saves: named arrays of the caller's memory (not copied until
 * the save) and JSON metadata. */
AGENTRT_C_EXPORT int agentrt_state_create(agentrt_state** out);
AGENTRT_C_EXPORT void agentrt_state_free(agentrt_state* state);
/* `bytes` bytes at `data`, labelled with `dtype` ("float32", "uint8", ...)
 * and `shape` (ndim entries, may be 0 for a scalar). The product of the shape
 * times the dtype's size must equal `bytes` for the known dtypes. */
AGENTRT_C_EXPORT int agentrt_state_add(agentrt_state* state, const char* name, const void* data,
                                       size_t bytes, const char* dtype, const int64_t* shape,
                                       int ndim);
/* `count` elements of `dtype` at `data`: those at flat (row-major) indices
 * [begin, begin + count) of the global array `name` of `global_shape` (ndim
 * entries). The ranks' slices together form the array, which restores at any
 * world size (agentrt_restore_read). */
AGENTRT_C_EXPORT int agentrt_state_add_slice(agentrt_state* state, const char* name,
                                             const void* data, const char* dtype,
                                             const int64_t* global_shape, int ndim, uint64_t begin,
                                             uint64_t count);
AGENTRT_C_EXPORT int agentrt_state_set_metadata(agentrt_state* state, const char* json);

/* {"kind": "restored"|"fresh"|"corrupt", "step", "time", "world_size", "path"
 * (the step's directory; "" when none),
 * "metadata", "skipped": [{"step", "file", "reason"}], "entries": [{"name",
 * "dtype", "shape", "bytes"}] (this rank's own), "arrays": [{"name", "dtype",
 * "shape", "element_bytes"}] (global, any rank's), "describe": "restored step
 * 40 from ..."}. */
AGENTRT_C_EXPORT int agentrt_restore_info(const agentrt_restore* r, char** json_out);
/* A view of entry `name` of this rank's restored shard, valid until
 * agentrt_restore_free. NOT_FOUND names the entries there are. */
AGENTRT_C_EXPORT int agentrt_restore_entry(const agentrt_restore* r, const char* name,
                                           const void** data, size_t* bytes);
/* Copies elements [begin, begin + count) of global array `name` of the
 * restored step into `dst` (`dst_bytes` = count times the element size),
 * whichever ranks saved them; only the chunks that hold them are read, each
 * verified (DATA_LOSS names the file and bytes). */
AGENTRT_C_EXPORT int agentrt_restore_read(const agentrt_restore* r, const char* name,
                                          uint64_t begin, uint64_t count, void* dst,
                                          size_t dst_bytes);
AGENTRT_C_EXPORT void agentrt_restore_free(agentrt_restore* r);

/* ---- Bus (comms/bus_client.h) ---------------------------------------- */

/* The agent's own connection (AGENTRT_BUS, AGENTRT_TOKEN_FILE), or one to
 * `address` ("host:port") as `agent` with `token`. Connects lazily. */
AGENTRT_C_EXPORT int agentrt_bus_from_environment(agentrt_bus** out);
AGENTRT_C_EXPORT int agentrt_bus_connect(const char* address, const char* agent, const char* token,
                                         agentrt_bus** out);
/* Ends its subscriptions, flushes async publishes; frees the handle (a
 * borrowed one: the subscriptions made through it and the handle). */
AGENTRT_C_EXPORT void agentrt_bus_close(agentrt_bus* bus);
AGENTRT_C_EXPORT int agentrt_bus_wait_ready(agentrt_bus* bus, int timeout_ms);
/* Stores one message; *offset (optional) is where. */
AGENTRT_C_EXPORT int agentrt_bus_publish(agentrt_bus* bus, const char* topic, const void* data,
                                         size_t len, const char* content_type, int64_t* offset);
/* Queues one message (stored in order, in the background; blocks while too
 * many are unacknowledged). Failures surface in agentrt_bus_flush. */
AGENTRT_C_EXPORT int agentrt_bus_publish_async(agentrt_bus* bus, const char* topic,
                                               const void* data, size_t len,
                                               const char* content_type);
AGENTRT_C_EXPORT int agentrt_bus_flush(agentrt_bus* bus, int timeout_ms);
/* A direct message to agent `to`'s inbox. */
AGENTRT_C_EXPORT int agentrt_bus_send(agentrt_bus* bus, const char* to, const void* data,
                                      size_t len, int64_t* offset);
/* Request/reply: waits up to timeout_ms for `to` to reply; *reply is a
 * message the caller frees (payload, content type, publisher = the replier). */
AGENTRT_C_EXPORT int agentrt_bus_request(agentrt_bus* bus, const char* to, const void* data,
                                         size_t len, int timeout_ms, agentrt_message** reply);
AGENTRT_C_EXPORT int agentrt_bus_reply(agentrt_bus* bus, uint64_t request_id, const void* data,
                                       size_t len);

enum agentrt_start {
  AGENTRT_START_EARLIEST = 0,
  AGENTRT_START_LATEST = 1,
  AGENTRT_START_OFFSET = 2
};
enum agentrt_event {
  AGENTRT_EVENT_CONNECTED = 0,
  AGENTRT_EVENT_RECONNECTING = 1,
  AGENTRT_EVENT_BROKER_RESTARTED = 2,
  AGENTRT_EVENT_OFFSET_EXPIRED = 3,
  AGENTRT_EVENT_FAILED = 4
};
/* On a subscription's thread; `m` is valid during the call only. */
typedef void (*agentrt_message_fn)(void* user, const agentrt_message* m);
typedef void (*agentrt_event_fn)(void* user, int kind, const char* topic, int64_t offset,
                                 int64_t earliest, int code, const char* message);
/* A background subscription to `topic` (NULL: this agent's inbox) from
 * `start` (with AGENTRT_START_OFFSET: `offset` of broker `incarnation`, 0 when
 * unknown). skip_expired: go on from the earliest held offset when `offset`
 * fell out of retention (else the subscription fails). */
AGENTRT_C_EXPORT int agentrt_bus_subscribe(agentrt_bus* bus, const char* topic, int start,
                                           int64_t offset, uint64_t incarnation, int skip_expired,
                                           agentrt_message_fn on_message, agentrt_event_fn on_event,
                                           void* user, uint64_t* id);
/* The same, pulled: messages wait in a queue of `capacity` (the stream pauses,
 * nothing is dropped, while it is full) for agentrt_bus_next. */
AGENTRT_C_EXPORT int agentrt_bus_subscribe_queue(agentrt_bus* bus, const char* topic, int start,
                                                 int64_t offset, uint64_t incarnation,
                                                 int skip_expired, size_t capacity, uint64_t* id);
/* The next message of a queue subscription (the caller frees it), waiting up
 * to timeout_ms; *out = NULL on timeout. The subscription's error once it has
 * failed and its queue is empty. */
AGENTRT_C_EXPORT int agentrt_bus_next(agentrt_bus* bus, uint64_t id, int timeout_ms,
                                      agentrt_message** out);
/* The events of a queue subscription since the last call, as a JSON list of
 * {"kind", "topic", "offset", "earliest", "code", "message"}. */
AGENTRT_C_EXPORT int agentrt_bus_events(agentrt_bus* bus, uint64_t id, char** json_out);
/* Ends a subscription; no callback runs after it returns. */
AGENTRT_C_EXPORT int agentrt_bus_unsubscribe(agentrt_bus* bus, uint64_t id);
/* Where to resume, for a checkpoint: {"offsets": {topic: next offset},
 * "incarnation": N}. */
AGENTRT_C_EXPORT int agentrt_bus_positions(agentrt_bus* bus, char** json_out);
/* The broker's counters (BusStats) as JSON. */
AGENTRT_C_EXPORT int agentrt_bus_stats(agentrt_bus* bus, char** json_out);

AGENTRT_C_EXPORT const char* agentrt_message_topic(const agentrt_message* m);
AGENTRT_C_EXPORT int64_t agentrt_message_offset(const agentrt_message* m);
AGENTRT_C_EXPORT const void* agentrt_message_payload(const agentrt_message* m, size_t* len);
AGENTRT_C_EXPORT const char* agentrt_message_content_type(const agentrt_message* m);
AGENTRT_C_EXPORT const char* agentrt_message_publisher(const agentrt_message* m);
AGENTRT_C_EXPORT uint64_t agentrt_message_request_id(const agentrt_message* m);
AGENTRT_C_EXPORT int64_t agentrt_message_publish_time_ns(const agentrt_message* m);
/* ---- Weight streams (comms/weight_stream.h) ------------------------- */

/* Publishes a version of stream `stream` (topic "weights/<stream>"): `n`
 * tensors described by `tensors_json`, a JSON list of {"name", "dtype",
 * "shape"} in the order of data[i] (data[i] holds bytes[i] bytes). On the
 * broker's node the bytes go straight from data[i] into the broker's file.
 * *version (optional) is the new version's number (1, 2, ...). `incarnation`
 * is what the version says of its publisher (its restart count). */
AGENTRT_C_EXPORT int agentrt_weights_publish(agentrt_bus* bus, const char* stream,
                                             const char* tensors_json, const void* const* data,
                                             const size_t* bytes, size_t n, int64_t step,
                                             int64_t incarnation, int64_t* version);
/* As agentrt_weights_publish, but returns once the bytes are copied into
 * the stream's next slot (made ready in the background after the version
 * before: one memcpy); the version is stored in the background. The bus
 * handle keeps the stream's state until it is closed (which waits for a
 * version in flight). A call while one is in flight waits for it; if that
 * one failed, the call returns its error and publishes nothing. */
AGENTRT_C_EXPORT int agentrt_weights_publish_async(agentrt_bus* bus, const char* stream,
                                                   const char* tensors_json,
                                                   const void* const* data, const size_t* bytes,
                                                   size_t n, int64_t step, int64_t incarnation);
/* Waits up to timeout_ms until the version agentrt_weights_publish_async
 * has in flight is stored; *version (optional): its number (0 before the
 * first), or the error that kept it from being stored. */
AGENTRT_C_EXPORT int agentrt_weights_flush(agentrt_bus* bus, const char* stream,
                                           int64_t incarnation, int timeout_ms, int64_t* version);
/* Opens the handle's stream `stream` with delta versions on (delta 1) or
 * off (WeightStreamOptions: a publisher also publishes each version's
 * difference to the one before; a reader holding version N reads N + 1 from
 * it). Before the stream's first use on this handle; a stream open with the
 * other setting is refused (close it first). */
AGENTRT_C_EXPORT int agentrt_weights_open(agentrt_bus* bus, const char* stream, int64_t incarnation,
                                          int delta);
/* The handle's stream's counts (WeightStreamStats) as JSON:
 * {"deltas_published", "delta_bytes_published", "deltas_not_published",
 *  "versions_from_delta", "delta_bytes_read", "delta_mismatches",
 *  "whole_bytes_read", "versions_from_node_cache"}; zeros for a stream the
 *  handle has not opened. */
AGENTRT_C_EXPORT int agentrt_weights_stats(agentrt_bus* bus, const char* stream, char** json_out);
/* As agentrt_weights_flush, then the handle lets go of the stream: its
 * background thread ends and the slot readied for a next version is freed
 * (a later agentrt_weights_publish_async starts afresh). On an error (the
 * version in flight not stored, or not within timeout_ms) it keeps it. */
AGENTRT_C_EXPORT int agentrt_weights_close(agentrt_bus* bus, const char* stream,
                                           int64_t incarnation, int timeout_ms, int64_t* version);
/* Reads a version: mode 0 the newest (NOT_FOUND: none yet), 1 the newest
 * after `version` (waits up to timeout_ms: DEADLINE_EXCEEDED), 2 exactly
 * `version` (NOT_FOUND: not kept, or not yet). *out is freed with
 * agentrt_weights_free; on the broker's node it maps the broker's file. */
AGENTRT_C_EXPORT int agentrt_weights_get(agentrt_bus* bus, const char* stream, int mode,
                                         int64_t version, int timeout_ms, agentrt_weights** out);
/* {"version", "stream", "agent", "step", "incarnation", "mapped", "path",
 * "tensors": [{"name", "dtype", "shape", "offset", "bytes"}]} (offsets from
 * the payload's start). */
AGENTRT_C_EXPORT int agentrt_weights_info(const agentrt_weights* w, char** json_out);
/* The payload's bytes, read-only (a mapping: writing to it faults), valid
 * until agentrt_weights_free. */
AGENTRT_C_EXPORT int agentrt_weights_data(const agentrt_weights* w, const void** data,
                                          size_t* size);
AGENTRT_C_EXPORT void agentrt_weights_free(agentrt_weights* w);

/* GPU tensors (agent_runtime/device_weights.h). As agentrt_weights_publish,
 * with data[i] device memory of the caller's CUDA device `device`, read
 * after the work enqueued on `cuda_stream` (a cudaStream_t; NULL: the legacy
 * default stream) before the call; returns once the version is stored. A
 * reader on the same node copies it GPU to GPU through CUDA IPC
 * (agentrt_weights_read_device); every other reader gets it as a host
 * version. The handle keeps the stream (its device copies for readers)
 * until it is closed; on one handle a name is published either this way or
 * the host's. UNAVAILABLE without an NVIDIA driver or agentrt's GPU library
 * (libagentrt_cuda.so). */
AGENTRT_C_EXPORT int agentrt_weights_publish_device(agentrt_bus* bus, const char* stream,
                                                    const char* tensors_json,
                                                    const void* const* data, const size_t* bytes,
                                                    size_t n, int64_t step, int64_t incarnation,
                                                    int device, void* cuda_stream,
                                                    int64_t* version);
/* Copies version `version` (0: the newest; waits up to timeout_ms for one)
 * into device memory of the caller's CUDA device `device`: every tensor of
 * the version, each into data[i] of bytes[i] bytes (its exact size) for
 * names_json[i] (a JSON list of names, or of {"name", "dtype", "shape"},
 * whose dtype and shape must then be the tensor's), after the work enqueued on
 * `cuda_stream`; returns with the copies complete, *version_out (optional)
 * the version read. GPU to GPU through CUDA IPC when the publisher is on
 * this node, else through pinned host memory. INVALID_ARGUMENT (nothing
 * copied) when the targets do not match the version's tensors. */
AGENTRT_C_EXPORT int agentrt_weights_read_device(agentrt_bus* bus, const char* stream,
                                                 int64_t version, const char* names_json,
                                                 void* const* data, const size_t* bytes, size_t n,
                                                 int device, void* cuda_stream, int timeout_ms,
                                                 int64_t* version_out);

/* Frees a message from agentrt_bus_next or agentrt_bus_request. */
AGENTRT_C_EXPORT void agentrt_message_free(agentrt_message* m);

/* ---- Env pools (envs/env_pool.h, envs/multi_agent_env_pool.h) ----------- */

/* `num_envs` copies of the registered env `name` (cartpole, dummy, pursuit,
 * ...) with `params_json` (NULL: defaults), stepped by `num_threads` threads.
 * A multi-agent env exposes every seat. */
AGENTRT_C_EXPORT int agentrt_envpool_create(const char* name, const char* params_json, int num_envs,
                                            int num_threads, uint64_t seed, agentrt_envpool** out);
AGENTRT_C_EXPORT void agentrt_envpool_close(agentrt_envpool* pool);
/* {"env", "num_envs", "num_agents" (0: single-agent), "agent_names",
 * "obs_size", "act_size", "observation_space", "action_space"}. */
AGENTRT_C_EXPORT int agentrt_envpool_spec(const agentrt_envpool* pool, char** json_out);
/* has_seed = 0: each env's own seed (seed + i). */
AGENTRT_C_EXPORT int agentrt_envpool_reset(agentrt_envpool* pool, int has_seed, uint64_t seed);
/* Steps every env with the actions buffer; auto-resets ended episodes. */
AGENTRT_C_EXPORT int agentrt_envpool_step(agentrt_envpool* pool);

enum agentrt_buffer {
  AGENTRT_BUFFER_OBSERVATIONS = 0,       /* float32 [envs, (seats,) obs_size] */
  AGENTRT_BUFFER_FINAL_OBSERVATIONS = 1, /* float32 [envs, (seats,) obs_size] */
  AGENTRT_BUFFER_ACTIONS = 2,            /* float32 [envs, (seats,) act_size] (written by caller) */
  AGENTRT_BUFFER_REWARDS = 3,            /* float32 [envs (, seats)] */
  AGENTRT_BUFFER_TERMINATED = 4,         /* uint8 [envs] */
  AGENTRT_BUFFER_TRUNCATED = 5,          /* uint8 [envs] */
  AGENTRT_BUFFER_EPISODE_RETURNS = 6,    /* float32 [envs (, seats)] */
  AGENTRT_BUFFER_EPISODE_LENGTHS = 7,    /* int32 [envs] */
  AGENTRT_BUFFER_ACTIVE = 8              /* uint8 [envs, seats] (multi-agent only) */
};
/* The pool's own buffer `which` (see enum agentrt_buffer): *data, and *count
 * elements. The memory is the pool's, valid until it is closed; step and
 * reset rewrite it in place. */
AGENTRT_C_EXPORT int agentrt_envpool_buffer(agentrt_envpool* pool, int which, void** data,
                                            size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* AGENTRT_CAPI_AGENTRT_C_H_ */
