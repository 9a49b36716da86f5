// SPDX-License-Identifier: BSD-2-Clause
// Preloaded (node --require, through NODE_OPTIONS) into the npm MCP servers
// that tests run: they listen on every interface and have no flag for it;
// here a TCP listen on the unspecified address listens on 127.0.0.1.  At
// _listen2, where net binds (synchronously, as a listen without a host
// does: a caller may ask address() at once).
'use strict';

const net = require('net');
const listen2 = net.Server.prototype._listen2;

net.Server.prototype._listen2 = function (address, port, addressType, ...rest) {
    if (typeof port === 'number' && port >= 0
        && (!address || address === '::' || address === '0.0.0.0'))
    {
        address = '127.0.0.1';
        addressType = 4;
    }

    return listen2.call(this, address, port, addressType, ...rest);
};
