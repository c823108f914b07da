"""The controller quorum: metadata records, the image, the Raft shell, ControllerService."""
