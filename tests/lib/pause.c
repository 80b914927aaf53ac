/* The pod's placeholder container, as the seeds' pause images run it: sleep until told to stop. */
#include <signal.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;)
        pause();
}
