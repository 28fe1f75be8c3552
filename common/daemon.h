/* What every tandem daemon does the same way: the options they all take (runtime directory,
 * log level), stop signals (SIGTERM/SIGINT end the main loop; SIGPIPE is ignored so a peer
 * that goes away is an error, not a death), the endpoints of the services, and the hello a
 * daemon answers with. */
#ifndef TANDEM_COMMON_DAEMON_H
#define TANDEM_COMMON_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/msg.h"

/* Names the process in the log, applies --log-level (NULL: info) and --runtime-dir (NULL:
 * the default; sets TANDEM_RUNTIME_DIR so every endpoint lives there) and checks the
 * directory. */
td_err daemon_setup(const char *process, const char *runtime_dir, const char *level_name);

/* Installs the stop handlers (without SA_RESTART, so a blocking poll returns EINTR). */
void daemon_signals(void);

/* True once SIGTERM or SIGINT arrived. */
bool daemon_stopping(void);

/* The bus endpoint of service (verifyd, draftd, kvd, gateway-events, tandem): url_flag
 * when given, else ipc://<runtime dir>/<service>.ipc. */
td_err daemon_endpoint(char *url, size_t cap, const char *url_flag, const char *service);

/* kvd's fd socket path: path_flag when given, else <runtime dir>/kvd.sock. */
td_err daemon_kvd_fd_path(char *path, size_t cap, const char *path_flag);

/* The hello a daemon of role answers with (its pid, this protocol, the build id). */
td_err daemon_pack_hello(msg_buf *reply, uint64_t request_id, msg_role role);

/* Answers hello and ping the same way in every daemon: returns true (and fills reply or
 * sets *err) when the request was one of them. */
bool daemon_answer_common(const uint8_t *req, size_t len, const msg_header *h, msg_role role,
                          msg_buf *reply, td_err *err);

#endif
