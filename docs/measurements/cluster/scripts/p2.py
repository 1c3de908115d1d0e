# P2: the remote and local stage releases as CUTLASS's ClusterBarrier::arrive issues them (release at
# CTA scope, the default), instead of .release.cluster
import pathlib
p = pathlib.Path("kernels/hopper/ptx.cuh"); s = p.read_text()
old = '"mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\\n"'
assert old in s, "pattern"
p.write_text(s.replace(old, '"mbarrier.arrive.shared::cluster.b64 _, [%0];\\n"'))
print("patched P2")
