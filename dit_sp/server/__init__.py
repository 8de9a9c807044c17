"""HTTP servers over the library: the reward server (``rewards.RewardServer``) and the limits it holds its
clients to (``limits.ServerLimits``)."""
