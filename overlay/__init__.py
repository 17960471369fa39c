"""Moving bytes between populi nodes: transports, overlay detection, discovery, authentication."""
