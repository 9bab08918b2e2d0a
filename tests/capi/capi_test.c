/* The C API from C (not C++): the header is valid C, codes and the thread's
 * last error, an env pool's buffers, a checkpoint round trip, and handles of
 * the wrong kind of input refused with a message. Exits non-zero on the first
 * check that fails, naming it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/agentrt_c.h"

static int failures = 0;
#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) {                                                  \
      fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                   \
    }                                                               \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  CHECK(agentrt_api_version() == AGENTRT_C_API_VERSION);
  CHECK(strcmp(agentrt_code_name(AGENTRT_UNAVAILABLE), "UNAVAILABLE") == 0);
  CHECK(strcmp(agentrt_code_name(99), "UNKNOWN") == 0);

  /* Outside agentctl: a clear error, not a crash. */
  agentrt_runtime* rt = NULL;
  CHECK(agentrt_runtime_open(0, 0, &rt) == AGENTRT_NOT_FOUND);
  CHECK(rt == NULL);
  CHECK(strstr(agentrt_last_error(), "AGENTRT_RUN_DIR") != NULL);
  CHECK(agentrt_runtime_open(0, 0, NULL) == AGENTRT_INVALID_ARGUMENT);

  /* An env pool: buffers of the documented sizes, stepped in place. */
  agentrt_envpool* pool = NULL;
  CHECK(agentrt_envpool_create("nope", NULL, 4, 1, 0, &pool) == AGENTRT_NOT_FOUND);
  CHECK(strstr(agentrt_last_error(), "cartpole") != NULL);
  CHECK(agentrt_envpool_create("cartpole", "{bad", 4, 1, 0, &pool) == AGENTRT_INVALID_ARGUMENT);
  CHECK(agentrt_envpool_create("cartpole", NULL, 4, 1, 7, &pool) == AGENTRT_OK);
  if (pool != NULL) {
    void* obs = NULL;
    void* act = NULL;
    size_t n_obs = 0, n_act = 0;
    CHECK(agentrt_envpool_buffer(pool, AGENTRT_BUFFER_OBSERVATIONS, &obs, &n_obs) == AGENTRT_OK);
    CHECK(agentrt_envpool_buffer(pool, AGENTRT_BUFFER_ACTIONS, &act, &n_act) == AGENTRT_OK);
    CHECK(n_obs == 16 && n_act == 4);
    CHECK(agentrt_envpool_buffer(pool, AGENTRT_BUFFER_ACTIVE, &obs, &n_obs) ==
          AGENTRT_INVALID_ARGUMENT);
    CHECK(agentrt_envpool_reset(pool, 0, 0) == AGENTRT_OK);
    CHECK(agentrt_envpool_step(pool) == AGENTRT_OK);
    char* spec = NULL;
    CHECK(agentrt_envpool_spec(pool, &spec) == AGENTRT_OK);
    CHECK(spec != NULL && strstr(spec, "\"obs_size\":4") != NULL);
    agentrt_free(spec);
    agentrt_envpool_close(pool);
  }

  /* A checkpoint round trip through caller-owned buffers. */
  agentrt_checkpointer* ck = NULL;
  CHECK(agentrt_checkpointer_create(argv[1], "c-agent", 0, 1, 0, 2, &ck) == AGENTRT_OK);
  agentrt_state* state = NULL;
  CHECK(agentrt_state_create(&state) == AGENTRT_OK);
  float w[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {2, 3};
  CHECK(agentrt_state_add(state, "w", w, sizeof w, "float32", shape, 2) == AGENTRT_OK);
  CHECK(agentrt_state_add(state, "w", w, sizeof w, "float32", shape, 2) == AGENTRT_ALREADY_EXISTS);
  CHECK(agentrt_state_add(state, "x", w, 5, "float32", shape, 2) == AGENTRT_INVALID_ARGUMENT);
  CHECK(strstr(agentrt_last_error(), "24 bytes, but 5") != NULL);
  CHECK(agentrt_state_add(state, "y", w, 4, "float128", NULL, 0) == AGENTRT_INVALID_ARGUMENT);
  CHECK(agentrt_state_set_metadata(state, "{\"lr\": 0.5}") == AGENTRT_OK);
  CHECK(agentrt_checkpointer_save(ck, 3, state, 1) == AGENTRT_OK);
  w[0] = -1; /* after an async save returns, the buffer is the caller's again */
  CHECK(agentrt_checkpointer_wait(ck) == AGENTRT_OK);
  agentrt_restore* r = NULL;
  CHECK(agentrt_checkpointer_restore(ck, &r) == AGENTRT_OK);
  if (r != NULL) {
    const void* data = NULL;
    size_t bytes = 0;
    CHECK(agentrt_restore_entry(r, "w", &data, &bytes) == AGENTRT_OK);
    CHECK(bytes == sizeof w && ((const float*)data)[0] == 1.0f && ((const float*)data)[5] == 6.0f);
    CHECK(agentrt_restore_entry(r, "v", &data, &bytes) == AGENTRT_NOT_FOUND);
    CHECK(strstr(agentrt_last_error(), "it has w") != NULL);
    char* info = NULL;
    CHECK(agentrt_restore_info(r, &info) == AGENTRT_OK);
    CHECK(info != NULL && strstr(info, "\"kind\":\"restored\"") != NULL &&
          strstr(info, "\"lr\":0.5") != NULL);
    agentrt_free(info);
    agentrt_restore_free(r);
  }
  agentrt_state_free(state);
  agentrt_checkpointer_close(ck);
  CHECK(agentrt_checkpointer_create(argv[1], "c-agent", 3, 2, 0, 2, &ck) ==
        AGENTRT_INVALID_ARGUMENT);

  /* Bus calls with no bus: an error with a message. */
  agentrt_bus* bus = NULL;
  CHECK(agentrt_bus_from_environment(&bus) != AGENTRT_OK);
  CHECK(strlen(agentrt_last_error()) > 0);

  /* Weight streams: bad arguments are refused before any call (the bus is
   * connected lazily, to an address nobody serves). */
  agentrt_weights* version = NULL;
  CHECK(agentrt_weights_get(NULL, "s", 0, 0, 10, &version) == AGENTRT_INVALID_ARGUMENT);
  CHECK(agentrt_bus_connect("127.0.0.1:1", "me", "token", &bus) == AGENTRT_OK);
  CHECK(agentrt_weights_get(bus, "s", 7, 0, 10, &version) == AGENTRT_INVALID_ARGUMENT);
  CHECK(strstr(agentrt_last_error(), "mode must be 0") != NULL && version == NULL);
  {
    const float t[2] = {1.0f, 2.0f};
    const void* data[1] = {t};
    const size_t bytes[1] = {sizeof t};
    CHECK(agentrt_weights_publish(bus, "s", "{\"name\": \"t\"}", data, bytes, 1, 1, 0, NULL) ==
          AGENTRT_INVALID_ARGUMENT);
    CHECK(strstr(agentrt_last_error(), "a list of 1 tensors") != NULL);
    CHECK(agentrt_weights_publish(bus, "s", "[{\"dtype\": \"float32\"}]", data, bytes, 1, 1, 0,
                                  NULL) == AGENTRT_INVALID_ARGUMENT);
    CHECK(strstr(agentrt_last_error(), "has no name") != NULL);
  }
  CHECK(agentrt_weights_info(NULL, NULL) == AGENTRT_INVALID_ARGUMENT);
  agentrt_weights_free(NULL);
  agentrt_bus_close(bus);

  if (failures == 0) printf("PASSED: the C API from C\n");
  return failures == 0 ? 0 : 1;
}
