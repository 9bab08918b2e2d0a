# TcpStore: the rendezvous key/value store, with threads and forked processes
# as its clients over real loopback TCP (free ports picked by binding port 0).
agentrt_test(NAME tcp_store_test
  SRCS tcp_store_test.cc
  DEPS agentrt::runtime
  LABELS unit
  TIMEOUT 60)
