"""Code only the tests run, kept out of the wheel: programs for real local host processes
(`multihost`, `survive`), machines made of network namespaces (`netns`), and the admission
rendezvous that co hosts meet at (`rendezvous`)."""
