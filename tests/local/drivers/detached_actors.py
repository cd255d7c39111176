"""A job that leaves N detached actors running (each its own Ray worker process) and exits."""

import sys

import ray

ray.init()


@ray.remote(num_cpus=0)
class Pinger:
    def ping(self) -> int:
        return 1


actors = [Pinger.options(name=f"pinger-{i}", lifetime="detached").remote() for i in range(int(sys.argv[1]))]
print(sum(ray.get([a.ping.remote() for a in actors])))
