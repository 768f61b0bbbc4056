/* The benchmark's frames made in the kernel (scripts/blast.py --xdp): one BPF_PROG_TEST_RUN of live frames
 * (BPF_F_TEST_XDP_LIVE_FRAMES) on the sender's core runs this on copies of one template frame; frame i goes to
 * port i % nports as that port's frame n = i / nports: its head (Ethernet, IPv4, UDP and innet headers: its
 * rank's addresses and fields) copied in, then chunk n + 1 + first (forward: n % rounds + first), slot
 * n % slots and the version flag ((n + 1) / slots) % 2 (sum): blast.c's frames in its order, ports in
 * lockstep, each redirected into its port's veth (a devmap entry). Paced (rate > 0), a frame not due yet is
 * dropped here unsent (the sender's core spins on them), and so is every frame after duration ns from the
 * first (the caller's alarm, a little later, ends the call: its setup takes ~25 ms). With hop = CPU + 1, each
 * frame goes first to that CPU (a cpumap entry, as a NIC's receive queue hands frames to the core that polls it),
 * whose kthread runs innet_xdpgen_hop on it: the redirect into the port's veth from there, so the veths' receive
 * (their NAPI: XDP program, skb) runs on that CPU in the order sent, the ports interleaved as the generator made them. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define HDR 42 /* Ethernet + IPv4 + UDP */
#define HEAD 58 /* and the innet header */
#define MAX_PORTS 64
#define VER 16

struct gen { __u64 slots, rounds, first, sum, nports, rate, start, sent, duration, hop; };
struct head { unsigned char b[64]; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct gen); } gen SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, struct head); } heads SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_DEVMAP); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, __u32); } out SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_CPUMAP); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, struct bpf_cpumap_val); } cpus SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, __u32); } port_of SEC(".maps");  /* IPv4 source -> port */

SEC("xdp")
int innet_xdpgen(struct xdp_md *ctx)
{
	unsigned char *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct gen *g = bpf_map_lookup_elem(&gen, &zero);
	if (!g || !g->slots || !g->rounds || !g->nports || data + HEAD > end)
		return XDP_ABORTED;
	__u64 now = bpf_ktime_get_ns();
	if (!g->start)
		g->start = now;
	if (g->duration && now - g->start >= g->duration)
		return XDP_DROP; /* the run's time is over: the caller's alarm ends the call */
	if (g->rate && g->start + g->sent * 1000000000ull / g->rate > now)
		return XDP_DROP; /* not due yet */
	__u32 port = g->sent % g->nports;
	__u64 n = g->sent / g->nports;
	struct head *h = bpf_map_lookup_elem(&heads, &port);
	if (!h)
		return XDP_ABORTED;
	g->sent += 1; /* one caller, on one core */
	__builtin_memcpy(data, h->b, HEAD);
	__u32 chunk = (__u32)((g->sum ? n + 1 : n % g->rounds) + g->first);
	*(__u32 *)(data + HDR + 8) = bpf_htonl(chunk);
	if (g->sum) {
		*(__u16 *)(data + HDR + 6) = bpf_htons((__u16)(n % g->slots));
		data[HDR + 14] = (data[HDR + 14] & ~VER) | ((n + 1) / g->slots % 2 ? VER : 0);
	}
	return g->hop ? bpf_redirect_map(&cpus, (__u32)(g->hop - 1), 0) : bpf_redirect_map(&out, port, 0);
}

SEC("xdp/cpumap")
int innet_xdpgen_hop(struct xdp_md *ctx)
{
	unsigned char *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + HDR > end)
		return XDP_ABORTED;
	__u32 src = *(__u32 *)(data + 26), *port = bpf_map_lookup_elem(&port_of, &src);
	return port ? bpf_redirect_map(&out, *port, 0) : XDP_ABORTED;
}

char LICENSE[] SEC("license") = "GPL";
