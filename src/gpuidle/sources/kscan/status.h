/* What the scanner's steps return. */
#ifndef GPUIDLE_KSCAN_STATUS_H
#define GPUIDLE_KSCAN_STATUS_H

/* FALLBACK: the chunk is not JSON, or holds what the typed decoder would judge differently: it decodes it. */
enum { OK = 0, FALLBACK = -1, NOMEM = -2 };

#endif
