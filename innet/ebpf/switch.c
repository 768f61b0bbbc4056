// innet's sum all-reduce as a tc (clsact) ingress program: Reduction's slot pool, exactly-once bitmaps,
// shadow copies, partials up to the parent and results multicast down, on innet's wire (innet.wire.packet);
// and routed frames (ring, PBox, fallbacks) forwarded by the switch's route table, as Context.route does.
// Frames it does not own (aborts, relays' jobs, groups, anything irregular or dropped) go on to the Python
// switch listening on the same ports (TC_ACT_OK); innet.ebpf.loader fills the maps and reads the counters back.
// Built by innet.ebpf.build with -DELEMS (values per packet) and -DKEYS (slots, both versions).
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef ELEMS
#define ELEMS 2048
#endif
#ifndef KEYS
#define KEYS 256
#endif
#define WORDS ((ELEMS + 1) / 2)  // a slot's values as 64-bit words
#define SIGNS 0x8000000080000000ULL  // a word's two int32 sign bits
#define MAX_PORTS 64
#define MAX_NODES 0x8000  // innet.wire.packet's GROUP_BASE: node indices below, multicast groups from there
#define INPUT_JOB 0xFFFF
#define P2P_JOB 0xFFFD
#define BANDS 3
#define AGG_PORT 48879
#define PAY_OFF 58
#define F_RESULT 1
#define F_RETX 2
#define F_ROUTE 4
#define F_OVERFLOW 8
#define F_VER 16
#define F_SPARSE 32
#define F_ABORT 128
#define ALL_RANKS 0xFFFF
#define COLLECTING 0
#define WAITING 1
#define DONE 2
#define TAKING 3
enum { C_STALE, C_DUPLICATE, C_BAD_COUNT, C_ANSWERED, C_RESENT, C_ROUTED, C_FOREIGN, C_COUNTERS };

struct config { __u32 node; __u32 slots; };  // this switch's node index; the pool's slots (a version's)
struct port_info { __u32 ifindex; __u32 neighbor; };
struct job_info {
    __u32 nworkers, need, parent, is_root, rank, slot_base, slots, band, nchildren;
    __u32 children[MAX_PORTS];
};
struct member_key { __u32 job, rank; };
struct member { __u32 index, port; };
struct slot {
    struct bpf_spin_lock lock;
    __u32 state;
    __s64 chunk;
    __u64 seen;
    __u32 have, count, overflow;
    __s32 exp, pad;
    __s32 vals[2 * WORDS] __attribute__((aligned(8)));
};
struct inbox { __s32 vals[2 * WORDS] __attribute__((aligned(8))); };  // a contribution's values, copied to fold
struct port_stats { __u64 rx_packets, rx_bytes, tx_packets, tx_bytes; };

struct hdr {
    __u8 eth_dst[6], eth_src[6];
    __be16 ethertype;
    __u8 ver_ihl, tos;
    __be16 ip_len, ip_id, frag;
    __u8 ttl, proto;
    __be16 ip_csum;
    __be32 saddr, daddr;
    __be16 sport, dport, udp_len, udp_csum;
    __be16 job, rank, nworkers, slot;
    __be32 chunk;
    __be16 count;
    __u8 flags;
    __s8 exp;
} __attribute__((packed));

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct config); } cfg SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, struct port_info); } ports SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, __u32); } port_of SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, MAX_NODES); __type(key, __u32); __type(value, __u32); } routes SEC(".maps");  // node -> its port + 1 (0: none)
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 256); __type(key, __u32); __type(value, struct job_info); } jobs SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 8192); __type(key, struct member_key); __type(value, struct member); } members SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 8192); __type(key, struct member_key); __type(value, __u32); } towards SEC(".maps");  // JobPort.rank_ports
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, KEYS); __type(key, __u32); __type(value, struct slot); } pool SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, MAX_PORTS); __type(key, __u32); __type(value, struct port_stats); } stats SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, struct inbox); } inboxes SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, C_COUNTERS); __type(key, __u32); __type(value, __u64); } counters SEC(".maps");
// The XDP half's result multicast (the loader's xdp=True): per job aggregating at its root, its children's ports, each
// with innet_devmap to write that port's headers; a completing contribution becomes the result and leaves by all of
// them at once (bpf_redirect_map with BPF_F_BROADCAST: the kernel copies the frame per port, no skb at the switch).
struct children_ports {
    __uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
    __uint(max_entries, MAX_PORTS);
    __uint(key_size, sizeof(__u32));
    __uint(value_size, sizeof(struct bpf_devmap_val));
};
struct { __uint(type, BPF_MAP_TYPE_HASH_OF_MAPS); __uint(max_entries, 256); __type(key, __u32);
         __array(values, struct children_ports); } fanout SEC(".maps");

static __always_inline void count(__u32 what) {
    __u64 *c = bpf_map_lookup_elem(&counters, &what);
    if (c) *c += 1;
}

static __always_inline void note(__u32 port, int tx, __u64 bytes) {
    struct port_stats *s = bpf_map_lookup_elem(&stats, &port);
    if (!s) return;
    if (tx) { s->tx_packets += 1; s->tx_bytes += bytes; }
    else { s->rx_packets += 1; s->rx_bytes += bytes; }
}

static __always_inline int node_of(__be32 addr) {
    __u32 a = bpf_ntohl(addr);
    return (a >> 16) == ((10 << 8) | 77) ? (int)(a & 0xFFFF) - 1 : -1;
}

static __always_inline void mac_of(__u8 *mac, __u32 node) {
    mac[0] = 0x02; mac[1] = 0x69; mac[2] = 0x6E; mac[3] = 0x00; mac[4] = (node >> 8) & 0xFF; mac[5] = node & 0xFF;
}

// The Ethernet, IPv4 and UDP headers innet.wire.packet.frame_prefix writes from this switch to the port's neighbour.
static __always_inline void prefix(struct hdr *h, __u32 node, __u32 neighbor, __u32 band) {
    __u32 payload = 16 + 4 * (__u32)bpf_ntohs(h->count);
    mac_of(h->eth_dst, neighbor);
    mac_of(h->eth_src, node);
    h->ethertype = bpf_htons(0x0800);
    h->ver_ihl = 0x45; h->tos = band << 2;
    h->ip_len = bpf_htons(20 + 8 + payload); h->ip_id = 0; h->frag = bpf_htons(0x4000);
    h->ttl = 64; h->proto = 17; h->ip_csum = 0;
    h->saddr = bpf_htonl((10 << 24) | (77 << 16) | (node + 1));
    h->daddr = bpf_htonl((10 << 24) | (77 << 16) | (neighbor + 1));
    h->sport = bpf_htons(AGG_PORT); h->dport = bpf_htons(AGG_PORT);
    h->udp_len = bpf_htons(8 + payload); h->udp_csum = 0;
    __u32 sum = 0;
    __u16 *w = (__u16 *)&h->ver_ihl;
#pragma unroll
    for (int i = 0; i < 10; i++) sum += bpf_ntohs(w[i]);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    h->ip_csum = bpf_htons(~sum & 0xFFFF);
}

// The socket priority pfifo_fast queues ``band`` in (innet.io.rawport's SOCKET_PRIORITY, as the Python switch sends).
static __always_inline __u32 priority_of(__u32 band) {
    return band == 0 ? 6 : band == 1 ? 0 : 2;
}

// Send the frame (its header ``h``, its values already in place) out of ``port``: a copy, or the frame itself.
static __always_inline int emit(struct __sk_buff *skb, struct hdr *h, __u32 node, __u32 port, __u32 band, int clone) {
    struct port_info *p = bpf_map_lookup_elem(&ports, &port);
    if (!p) return TC_ACT_SHOT;
    prefix(h, node, p->neighbor, band);
    if (bpf_skb_store_bytes(skb, 0, h, sizeof(*h), 0)) return TC_ACT_SHOT;
    skb->priority = priority_of(band);
    note(port, 1, skb->len);
    if (clone) return bpf_clone_redirect(skb, p->ifindex, 0) ? TC_ACT_SHOT : TC_ACT_OK;
    return bpf_redirect(p->ifindex, 0);
}

// The slot's values over the frame's (``n`` of them: the frame's count and the slot's).
static __always_inline int write_values(struct __sk_buff *skb, struct slot *s, __u32 n) {
    __u32 len = n * 4;
    asm volatile("" : "+r"(len));  // the verifier must see the bounds tested on len itself
    if (len < 4 || len > ELEMS * 4) return 0;
    return bpf_skb_store_bytes(skb, PAY_OFF, s->vals, len, 0);
}

// The frame's ``n`` values (read from ``in``: its copy) folded into the slot, the caller holding its lock (no other
// CPU reads or writes them meanwhile): stored when ``first`` (the round's first contribution: no zeroing between
// rounds), else added, two values a 64-bit word (an odd count's last word completed with a zero, which never wraps).
// 1 if any addition wrapped (int32), as the Python switch's fold flags it, in arrival order. Not inlined: its loop
// gets the registers to itself (inlined, it spilled to the stack every word); a static call is allowed under a lock.
static __attribute__((noinline)) int fold(struct inbox *in, struct slot *s, __u32 n, int first) {
    __u64 *from = (__u64 *)in->vals, *to = (__u64 *)s->vals;
    __u32 words = (n + 1) / 2;
    if (first) {
        for (__u32 i = 0; i < WORDS; i++) {
            if (i >= words) break;
            to[i] = from[i];
        }
        return 0;
    }
    __u64 wrapped = 0;
    for (__u32 i = 0; i < WORDS; i++) {
        if (i >= words) break;
        __u64 x = from[i], y = to[i];
        // both int32 lanes added at once, no carry from the low lane into the high one (SWAR): the lanes' low 31
        // bits added, their sign bits put back by xor; a lane wrapped where x and y agree in sign and its sum does not
        __u64 sum = ((x & ~SIGNS) + (y & ~SIGNS)) ^ ((x ^ y) & SIGNS);
        wrapped |= (x ^ sum) & (y ^ sum);
        to[i] = sum;
    }
    return (wrapped & SIGNS) != 0;
}

// A replicating collective's contribution (all-gather, broadcast: innet.switch.routed.replica_mark): one rank sends
// a chunk's values, every other rank its header alone, and the slot's values are the ones that came.
static __always_inline int replicates(struct job_info *j, __be16 field) {
    return bpf_ntohs(field) == 2 * j->nworkers + 1;
}

// The nworkers field a switch sends on (innet.switch.routed.kept_field): a mark naming the one rank a slot's values
// are for (reduce-scatter's shard owner, reduce's root: nworkers + 1 + rank) or a replicating collective's mark as it
// came, else the job's size.
static __always_inline __be16 kept(struct job_info *j, __be16 field) {
    __u32 f = bpf_ntohs(field);
    return (f > j->nworkers && f - j->nworkers - 1 < j->nworkers) || replicates(j, field) ? field
                                                                                             : bpf_htons(j->nworkers);
}

// The frame cut or grown to carry ``n`` values (the slot's, which a header or a replica's header may lack), its
// header's count saying so; 0 when it does.
static __always_inline int fit(struct __sk_buff *skb, struct hdr *h, __u32 n) {
    if (n > ELEMS) return -1;
    h->count = bpf_htons(n);
    return skb->len == PAY_OFF + 4 * n ? 0 : (int)bpf_skb_change_tail(skb, PAY_OFF + 4 * n, 0);
}

// The child port towards the rank a result's values are for (innet.switch.routed.dest_of): -1 when they are for
// every rank (or it has none), -2 when the rank is not below this switch.
static __always_inline int towards_of(struct job_info *j, struct hdr *h) {
    __u32 f = bpf_ntohs(h->nworkers);
    if (!h->count || f <= j->nworkers || f - j->nworkers - 1 >= j->nworkers) return -1;
    struct member_key k = { bpf_ntohs(h->job), f - j->nworkers - 1 };
    __u32 *port = bpf_map_lookup_elem(&towards, &k);
    return port ? (int)*port : -2;
}

struct copying { struct __sk_buff *skb; struct job_info *j; __u32 node; int towards; };

// A copy of the result in the frame to the job's child ``i``: to every child (``towards`` -1); else its values
// to the child towards their rank, or (the frame cut to its header) its header alone to every other child.
static long copy_to_child(__u32 i, void *arg) {
    struct copying *m = arg;
    struct hdr h;
    if (i >= MAX_PORTS || bpf_skb_load_bytes(m->skb, 0, &h, sizeof(h))) return 1;
    __u32 port = m->j->children[i];
    if (m->towards == -1 || (h.count ? (int)port == m->towards : (int)port != m->towards))
        emit(m->skb, &h, m->node, port, m->j->band, 1);
    return 0;
}

// The header of what a slot sends (``flags``: F_RESULT, F_RETX or none, the frame's version kept): the slot's wrap
// flag and exponent.
static __always_inline void stamp(struct hdr *h, struct slot *s, __u32 flags) {
    h->flags = flags | (h->flags & F_VER) | (s->overflow ? F_OVERFLOW : 0);
    h->exp = s->exp;
}

// A complete slot: its result multicast down (the root), or its partial up to the parent.
static __always_inline int send_slot(struct __sk_buff *skb, struct hdr *h, struct slot *s, struct job_info *j,
                                     struct config *c, __u32 flags, __u16 rank) {
    __u32 n = s->count;  // a replicating slot's values may have come in another frame than this one
    if (fit(skb, h, n) || (n && write_values(skb, s, n))) return TC_ACT_SHOT;
    h->rank = bpf_htons(rank);
    stamp(h, s, flags);
    h->nworkers = kept(j, h->nworkers);
    if (!(flags & F_RESULT)) return emit(skb, h, c->node, j->parent, j->band, 0);
    __u32 children = j->nchildren < MAX_PORTS ? j->nchildren : MAX_PORTS;
    struct copying m = { .skb = skb, .j = j, .node = c->node, .towards = towards_of(j, h) };
    if (bpf_skb_store_bytes(skb, 0, h, sizeof(*h), 0)) return TC_ACT_SHOT;
    if (m.towards == -1 && children > 0 && children <= MAX_PORTS) {  // the last child gets the frame itself:
        bpf_loop(children - 1, copy_to_child, &m, 0);  // a clone fewer, and its copy of the frame to unshare it
        return emit(skb, h, c->node, j->children[children - 1], j->band, 0);
    }
    bpf_loop(children, copy_to_child, &m, 0);
    if (m.towards != -1) {  // innet.switch.routed.result_down: the other children hear the slot is complete
        h->count = 0;
        if (bpf_skb_change_tail(skb, PAY_OFF, 0) || bpf_skb_store_bytes(skb, 0, h, sizeof(*h), 0)) return TC_ACT_SHOT;
        bpf_loop(children, copy_to_child, &m, 0);
    }
    return TC_ACT_SHOT;
}

#define PASS 4  // take's answer to the XDP program: the frame goes on to the tc program, the slot untouched
#define QUIET 1  // take's quiet: the XDP program passes what sends a frame on to the tc program
#define COMPLETES 2  // or completes the slot itself (its result multicast by innet_xdp, the frame never an skb)

// What a contribution (its copy ``in``) does to the slot, the caller holding its lock: 0 added, 1 answer (a repeat of a
// finished slot), 2 resend up (a repeat of a slot waiting for its parent), 3 added and complete, else a counter + 10.
// ``quiet`` (the XDP program): PASS, the slot untouched, for any repeat and (QUIET) for whatever sends a frame (1, 2,
// 3): the tc program then does it all, so each frame is taken once, whole, by one program under the lock. COMPLETES:
// 3 as without ``quiet`` (the XDP program sends the result).
static __always_inline int take(struct slot *s, struct hdr *h, struct inbox *in, struct job_info *j, __u64 bit,
                                int quiet) {
    __s64 chunk = bpf_ntohl(h->chunk);
    __u32 n = bpf_ntohs(h->count);
    int what = 0;
    if (chunk < s->chunk) {
        return 10 + C_STALE;
    } else if (chunk > s->chunk) {
        if (quiet == QUIET && j->need == 1) return PASS;
        s->chunk = chunk; s->state = COLLECTING; s->have = 1; s->seen = bit;
        s->exp = h->exp; s->overflow = 0; s->count = n;
        fold(in, s, n, 1);
    } else if (s->seen & bit) {
        if (quiet) return PASS;
        what = s->state == DONE ? 1 : s->state == WAITING ? 2 : 10 + C_DUPLICATE;
    } else if (n != s->count && (!replicates(j, h->nworkers) || (n && s->count))) {
        what = 10 + C_BAD_COUNT;
    } else {  // a replica's values after its headers are the round's; a header after them adds nothing
        if (quiet == QUIET && s->have + 1 == j->need) return PASS;
        if (h->exp > s->exp) s->exp = h->exp;
        s->seen |= bit;
        s->have += 1;
        if (n != s->count) {
            if (n) {
                s->count = n;
                fold(in, s, n, 1);
            }
        } else if (fold(in, s, n, 0)) {
            s->overflow = 1;
        }
    }
    if (what == 0 && s->have == j->need) {  // the contribution that completes the slot sends it on
        s->state = j->is_root ? DONE : WAITING;
        what = 3;
    }
    return what;
}

// The contributor's bit in the slot's bitmap (0: not a member on this port: the Python switch drops it, not_member),
// and this CPU's inbox (the fold reads it under the lock) for its ``n`` values.
static __always_inline __u64 member_bit(struct hdr *h, __u32 port) {
    struct member_key mk = { bpf_ntohs(h->job), bpf_ntohs(h->rank) };
    struct member *m = bpf_map_lookup_elem(&members, &mk);
    return !m || m->port != port || m->index >= 64 ? 0 : 1ULL << m->index;
}

static __always_inline struct inbox *inbox_for(__u32 n) {
    __u32 zero = 0;
    struct inbox *in = bpf_map_lookup_elem(&inboxes, &zero);
    if (!in || n > ELEMS) return 0;
    if (n < 2 * WORDS) in->vals[n] = 0;  // an odd count's last word
    return in;
}

static __always_inline int contribution(struct __sk_buff *skb, struct hdr *h, __u32 port, struct job_info *j,
                                        struct slot *s, struct config *c) {
    __u64 bit = member_bit(h, port);
    if (!bit) return -1;
    __u32 n = bpf_ntohs(h->count), len = 4 * n;
    struct inbox *in = inbox_for(n);
    if (!in) return TC_ACT_SHOT;
    asm volatile("" : "+r"(len));  // the verifier must see the bounds tested on len itself
    if (len >= 4 && len <= ELEMS * 4 && bpf_skb_load_bytes(skb, PAY_OFF, in->vals, len)) return TC_ACT_SHOT;
    bpf_spin_lock(&s->lock);
    int what = take(s, h, in, j, bit, 0);
    bpf_spin_unlock(&s->lock);
    note(port, 0, skb->len);
    if (what == 1 || what == 2) {
        if (!(h->flags & F_RETX)) what = 10 + C_DUPLICATE;  // the network's copy of a counted one: nobody asked
    }
    if (what >= 10) { count(what - 10); return TC_ACT_SHOT; }
    if (what == 1) {  // a repeat of a finished slot: the result, back to the one who asked
        count(C_ANSWERED);
        n = s->count;  // the slot's values, whatever the repeat carried (a replica's header: none)
        if (fit(skb, h, n)) return TC_ACT_SHOT;
        h->nworkers = kept(j, h->nworkers);
        int to = towards_of(j, h);
        if (to == -1 || to == (int)port) {  // innet.switch.routed.answer: the values if their rank is behind the port
            if (n && write_values(skb, s, n)) return TC_ACT_SHOT;
        } else if (fit(skb, h, 0)) {
            return TC_ACT_SHOT;
        }
        stamp(h, s, F_RESULT);
        return emit(skb, h, c->node, port, j->band, 0);
    }
    if (what == 2) {  // a repeat of a slot waiting for its parent: the partial up again
        count(C_RESENT);
        return send_slot(skb, h, s, j, c, F_RETX, j->rank);
    }
    if (what != 3) return TC_ACT_SHOT;
    return j->is_root ? send_slot(skb, h, s, j, c, F_RESULT, ALL_RANKS) : send_slot(skb, h, s, j, c, 0, j->rank);
}

static __always_inline int result(struct __sk_buff *skb, struct hdr *h, __u32 port, struct job_info *j,
                                  struct slot *s, struct config *c) {
    __s64 chunk = bpf_ntohl(h->chunk);
    __u32 n = bpf_ntohs(h->count);
    int fresh = 0;
    bpf_spin_lock(&s->lock);
    if (chunk == s->chunk && s->state == WAITING) {
        s->state = TAKING;
        fresh = 1;
    }
    bpf_spin_unlock(&s->lock);
    note(port, 0, skb->len);
    if (!fresh) { count(C_STALE); return TC_ACT_SHOT; }
    __u32 len = n * 4;
    asm volatile("" : "+r"(len));
    if (len >= 4 && len <= ELEMS * 4 && bpf_skb_load_bytes(skb, PAY_OFF, s->vals, len)) return TC_ACT_SHOT;
    s->exp = h->exp; s->overflow = (h->flags & F_OVERFLOW) != 0; s->count = n;
    s->state = DONE;
    return send_slot(skb, h, s, j, c, F_RESULT, ALL_RANKS);
}

// A routed frame out of the port its destination routes to, its headers innet.wire.packet.frame_prefix's from its
// source to its destination in its own band (Context.route). What the Python switch drops or counts apart — its
// source off its route (spoofed_source), no route, the switch's own address, a group, point-to-point messages and
// the ensemble's input — and any frame longer than its header says go on to the Python switch.
static __always_inline int route(struct __sk_buff *skb, struct hdr *h, __u32 port, struct config *c) {
    int src = node_of(h->saddr), dst = node_of(h->daddr);
    __u32 job = bpf_ntohs(h->job);
    if (src < 0 || src >= MAX_NODES || dst < 0 || dst >= MAX_NODES || dst == (int)c->node || job == P2P_JOB
        || job == INPUT_JOB || skb->len != PAY_OFF + 4 * (__u32)bpf_ntohs(h->count))
        return TC_ACT_OK;
    __u32 from = src, to = dst;
    __u32 *back = bpf_map_lookup_elem(&routes, &from), *out = bpf_map_lookup_elem(&routes, &to);
    if (!back || *back != port + 1 || !out || !*out) return TC_ACT_OK;
    __u32 o = *out - 1;
    struct port_info *p = bpf_map_lookup_elem(&ports, &o);
    if (!p) return TC_ACT_OK;
    __u32 band = h->tos >> 2;
    if (band > BANDS - 1) band = BANDS - 1;
    note(port, 0, skb->len);
    prefix(h, from, to, band);
    if (bpf_skb_store_bytes(skb, 0, h, sizeof(*h), 0)) return TC_ACT_SHOT;
    skb->priority = priority_of(band);
    note(o, 1, skb->len);
    count(C_ROUTED);
    return bpf_redirect(p->ifindex, 0);
}

// Where an innet frame (its header ``h``, ``len`` bytes, in at ``ifindex``) goes: 1 routed (w's config and port
// filled), 0 a slot of a job aggregating here (all of w), -1 not this program's (the Python switch's, or the kernel's).
struct where { struct config *c; struct job_info *j; struct slot *s; __u32 port; };

static __always_inline int place(struct hdr *h, __u32 len, __u32 ifindex, struct where *w) {
    __u32 zero = 0;
    if (h->ver_ihl != 0x45 || h->proto != 17 || h->dport != bpf_htons(AGG_PORT)) return -1;
    __u32 n = bpf_ntohs(h->count);
    if (bpf_ntohs(h->udp_len) != 8 + 16 + 4 * n || len < PAY_OFF + 4 * n) return -1;
    w->c = bpf_map_lookup_elem(&cfg, &zero);
    __u32 *port = bpf_map_lookup_elem(&port_of, &ifindex);
    if (!w->c || !port) return -1;
    __u32 p = w->port = *port;
    if (h->flags & F_ROUTE) return 1;
    if (h->flags & (F_ABORT | F_SPARSE) || n > ELEMS) return -1;
    struct port_info *info = bpf_map_lookup_elem(&ports, &p);
    if (!info || node_of(h->saddr) != (int)info->neighbor) return -1;  // the Python switch: spoofed_source
    __u32 job = bpf_ntohs(h->job);
    w->j = bpf_map_lookup_elem(&jobs, &job);
    if (!w->j) return -1;  // not an aggregating job here: the Python switch relays it
    __u32 slot = bpf_ntohs(h->slot);
    if (slot >= w->j->slots || kept(w->j, h->nworkers) != h->nworkers) return -1;  // not this job's mark
    __u32 key = (h->flags & F_VER ? w->c->slots : 0) + w->j->slot_base + slot;
    w->s = bpf_map_lookup_elem(&pool, &key);
    return w->s ? 0 : -1;
}

SEC("tc")
int innet_switch(struct __sk_buff *skb) {
    struct hdr h;
    struct where w;
    __u16 type = 0;
    // not IPv4: foreign, counted here as the Python switch counts it (its sockets here hear IPv4 only) and dropped,
    // but ARP, left to the kernel as there: the IP network beside innet's frames (innet.backends.mininet.iplane) needs it
    if (bpf_skb_load_bytes(skb, 12, &type, sizeof(type)) || type != bpf_htons(0x0800)) {
        count(C_FOREIGN);
        return type == bpf_htons(0x0806) ? TC_ACT_OK : TC_ACT_SHOT;
    }
    if (bpf_skb_load_bytes(skb, 0, &h, sizeof(h))) return TC_ACT_OK;
    int where = place(&h, skb->len, skb->ifindex, &w);
    if (where < 0) return TC_ACT_OK;
    if (where > 0) return route(skb, &h, w.port, w.c);
    if (!(h.flags & F_RESULT)) {
        int verdict = contribution(skb, &h, w.port, w.j, w.s, w.c);
        return verdict < 0 ? TC_ACT_OK : verdict;
    }
    if (w.j->is_root || w.port != w.j->parent) return TC_ACT_OK;  // the Python switch drops it: result_from_child
    return result(skb, &h, w.port, w.j, w.s, w.c);
}

// The root's result in the frame that completed the slot (``h`` its header), to every child at once: send_slot's
// frame, each port's headers written by innet_devmap on its copy.
static __always_inline int xdp_result(struct xdp_md *ctx, struct hdr *h, struct slot *s, struct job_info *j,
                                      void *children) {
    __u32 len = 4 * s->count;
    asm volatile("" : "+r"(len));  // the verifier must see the bounds tested on len itself
    if (len >= 4 && len <= ELEMS * 4 && bpf_xdp_store_bytes(ctx, PAY_OFF, s->vals, len)) return XDP_DROP;
    h->rank = bpf_htons(ALL_RANKS);
    stamp(h, s, F_RESULT);
    h->tos = j->band << 2;  // the band, for innet_devmap's prefix
    if (bpf_xdp_store_bytes(ctx, 0, h, sizeof(*h))) return XDP_DROP;
    return bpf_redirect_map(children, 0, BPF_F_BROADCAST);
}

// The children's ports innet_xdp may multicast a result of ``w``'s slot to (0: none; the tc program sends it): at the
// root, a result for every rank (no mark, no replica), the frame its header's length (fit's: nothing to cut) and
// whole in its first buffer (the kernel copies that alone per port), and the job's ports in ``fanout``.
static __always_inline void *xdp_children(struct xdp_md *ctx, struct hdr *h, struct where *w, __u32 len) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    if (!w->j->is_root || towards_of(w->j, h) != -1 || replicates(w->j, h->nworkers)
        || len != PAY_OFF + 4 * (__u32)bpf_ntohs(h->count) || data + len > end)  // place: a count of ELEMS at most
        return 0;
    __u32 job = bpf_ntohs(h->job);
    return bpf_map_lookup_elem(&fanout, &job);
}

// The XDP half (loader's xdp=True, before the tc program on the same ports): a contribution that only folds into its
// slot (or is dropped and counted: stale, a bad count) is taken here, before the kernel makes an skb of it, and so is
// one completing a root's slot whose children's ports are in ``fanout``: its result leaves by them all (no skb at the
// switch; it never meets the ports' qdiscs, which is why only unshaped ports may have it). Every other frame (repeats,
// results, partials up, routed, foreign) goes on untouched to the tc program above (XDP_PASS), which takes it as it
// takes every frame without this half. xdp.frags: the ports' jumbo MTU.
SEC("xdp.frags")
int innet_xdp(struct xdp_md *ctx) {
    struct hdr h;
    struct where w;
    __u32 len = bpf_xdp_get_buff_len(ctx);
    if (bpf_xdp_load_bytes(ctx, 0, &h, sizeof(h)) || h.ethertype != bpf_htons(0x0800)) return XDP_PASS;
    if (place(&h, len, ctx->ingress_ifindex, &w) != 0 || (h.flags & F_RESULT)) return XDP_PASS;
    __u64 bit = member_bit(&h, w.port);
    __u32 n = bpf_ntohs(h.count), bytes = 4 * n;
    struct inbox *in = inbox_for(n);
    if (!bit || !in) return XDP_PASS;
    void *children = xdp_children(ctx, &h, &w, len);
    asm volatile("" : "+r"(bytes));  // the verifier must see the bounds tested on bytes itself
    if (bytes >= 4 && bytes <= ELEMS * 4 && bpf_xdp_load_bytes(ctx, PAY_OFF, in->vals, bytes)) return XDP_PASS;
    bpf_spin_lock(&w.s->lock);
    int what = take(w.s, &h, in, w.j, bit, children ? COMPLETES : QUIET);
    bpf_spin_unlock(&w.s->lock);
    if (what == PASS) return XDP_PASS;
    note(w.port, 0, len);
    if (what >= 10) count(what - 10);
    return what == 3 && children ? xdp_result(ctx, &h, w.s, w.j, children) : XDP_DROP;
}

// A result's copy on its way out of a child's port (innet_xdp's multicast): the headers from this switch to the
// port's neighbour in the frame's band (emit's prefix), counted as the port's.
SEC("xdp.frags/devmap")
int innet_devmap(struct xdp_md *ctx) {
    struct hdr h;
    __u32 zero = 0, ifindex = ctx->egress_ifindex;
    struct config *c = bpf_map_lookup_elem(&cfg, &zero);
    __u32 *port = bpf_map_lookup_elem(&port_of, &ifindex);
    if (!c || !port || bpf_xdp_load_bytes(ctx, 0, &h, sizeof(h))) return XDP_DROP;
    __u32 p = *port;
    struct port_info *info = bpf_map_lookup_elem(&ports, &p);
    if (!info) return XDP_DROP;
    prefix(&h, c->node, info->neighbor, h.tos >> 2);
    if (bpf_xdp_store_bytes(ctx, 0, &h, sizeof(h))) return XDP_DROP;
    note(p, 1, bpf_xdp_get_buff_len(ctx));
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
