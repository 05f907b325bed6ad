"""The data service's shared core, imported by every wing and importing none: the sharding
policy and its one conversion to and from the wire (:mod:`.config`), the wire's tables
(:mod:`.wire`), the static-sharding and coordinated-read rules as pure functions
(:mod:`.static_policy`, :mod:`.coordinated`), sets of element numbers (:mod:`.ranges`), this
host's identity for same-host transfer (:mod:`.host`) and the servers' configs
(:mod:`.server_config`)."""
