/* scripts/blast.py's send loop in C (built at run time with the machine's cc, called through ctypes): the
 * same frames, the same round-robin over the ports, the same pacing and chunk renumbering, without the
 * Python interpreter's work between system calls, so a benchmark's sender is the kernel's send path alone.
 *
 * frames: nports x count rows of stride bytes, port p's frame k at row p * count + k, each length bytes.
 * Sends batches of up to batch frames per port with one sendmmsg each, round-robin, for seconds (paced to
 * rate frames/s over all ports when rate > 0); after each whole pass adds advance to every frame's
 * big-endian chunk number at byte chunk_at (advance 0: none). Returns the frames the kernel took, and
 * writes the seconds it ran to *elapsed. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void advance_chunks(unsigned char *frames, long rows, long stride, long chunk_at, uint32_t advance)
{
	for (long k = 0; k < rows; k++) {
		unsigned char *c = frames + k * stride + chunk_at;
		uint32_t v = ((uint32_t)c[0] << 24 | (uint32_t)c[1] << 16 | (uint32_t)c[2] << 8 | c[3]) + advance;
		c[0] = v >> 24;
		c[1] = v >> 16;
		c[2] = v >> 8;
		c[3] = v;
	}
}

long blast(const int *fds, int nports, unsigned char *frames, long count, long stride, long length,
	   long chunk_at, uint32_t advance, double seconds, double rate, int batch, double *elapsed)
{
	long rows = (long)nports * count, sent = 0, position = 0;
	struct mmsghdr *msgs = calloc(rows, sizeof(*msgs));
	struct iovec *iov = calloc(rows, sizeof(*iov));
	if (!msgs || !iov) {
		free(msgs);
		free(iov);
		return -1;
	}
	for (long k = 0; k < rows; k++) {
		iov[k].iov_base = frames + k * stride;
		iov[k].iov_len = length;
		msgs[k].msg_hdr.msg_iov = &iov[k];
		msgs[k].msg_hdr.msg_iovlen = 1;
	}
	double start = now_s(), end = start + seconds, t = start;
	while (t < end) {
		if (rate > 0) {
			double ahead = start + sent / rate - t;
			if (ahead > 0) {
				struct timespec nap = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
				nanosleep(&nap, NULL);
			}
		}
		long step = count - position < batch ? count - position : batch;
		for (int p = 0; p < nports; p++) {
			int n = sendmmsg(fds[p], msgs + p * count + position, step, MSG_DONTWAIT);
			if (n > 0)
				sent += n;
		}
		position = (position + step) % count;
		if (position == 0 && advance)
			advance_chunks(frames, rows, stride, chunk_at, advance);
		t = now_s();
	}
	*elapsed = t - start;
	free(msgs);
	free(iov);
	return sent;
}

/* The frames made in the kernel instead (scripts/xdpgen.bpf.c, loaded as prog_fd, its maps filled): one
 * BPF_PROG_TEST_RUN of live frames from template (length bytes), batch frames to a batch, ended by an alarm
 * after seconds and 0.1 (the program stops at its duration). Returns 0 (the frames sent, and the first one's CLOCK_MONOTONIC time, are in the program's map)
 * or -errno; *ended: when the alarm rang (CLOCK_MONOTONIC seconds; the call's setup, ~25 ms, is not sending). */
#include <errno.h>
#include <linux/bpf.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

static volatile double woken;

static void wake(int sig)
{
	(void)sig;
	woken = now_s();
}

long xdp_blast(int prog_fd, unsigned char *template, long length, double seconds, int batch, double *ended)
{
	struct sigaction sa, old;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = wake; /* no SA_RESTART: the alarm ends the system call */
	sigaction(SIGALRM, &sa, &old);
	union bpf_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.test.prog_fd = prog_fd;
	attr.test.data_in = (unsigned long)template;
	attr.test.data_size_in = length;
	attr.test.repeat = 0x7fffffff;
	attr.test.batch_size = batch;
	attr.test.flags = BPF_F_TEST_XDP_LIVE_FRAMES;
	seconds += 0.1; /* the program stops sending after its duration: the alarm only ends the call */
	struct itimerval it = {{0, 0}, {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e6)}};
	woken = 0;
	setitimer(ITIMER_REAL, &it, NULL);
	long err = syscall(__NR_bpf, BPF_PROG_TEST_RUN, &attr, sizeof(attr)) < 0 && errno != EINTR ? -errno : 0;
	*ended = woken > 0 ? woken : now_s();
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);
	return err;
}
