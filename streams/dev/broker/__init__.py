"""The local single-node Apache Kafka broker (KRaft) behind `retro broker start`."""
