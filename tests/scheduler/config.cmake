# agents.yaml loader, hostlists, cluster inventories.
agentrt_test(NAME scheduler_config_test
  SRCS config_loader_test.cc config_hostlist_test.cc config_inventory_test.cc
       config_league_test.cc
  DEPS agentrt::scheduler agentrt::runtime fmt::fmt  # the runtime: its FakeDevice
  LABELS unit
  TIMEOUT 60)
